# The public names of substrax.records, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._dump import dump_record as dump_record
from ._records import (
    UNKNOWN_FIELDS_REFUSED as UNKNOWN_FIELDS_REFUSED,
    read_record as read_record,
)
