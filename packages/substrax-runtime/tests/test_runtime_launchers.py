"""Reading a launch from a launcher's environment: pure functions, no jax."""

import pytest

from substrax.runtime import LaunchSettings, launch_from_environment, launch_from_modal_cluster
from substrax.runtime._launchers import coordinator_host, launch_from_arguments, with_port


def test_nothing_set_is_none():
    assert launch_from_environment({"HOME": "/h"}) is None


def test_plain_jax_variables():
    env = {
        "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
        "JAX_NUM_PROCESSES": "4",
        "JAX_PROCESS_ID": "3",
    }
    assert launch_from_environment(env) == LaunchSettings(
        coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3, source="jax_env"
    )


def test_partial_jax_variables_are_refused():
    with pytest.raises(ValueError, match="set without JAX_NUM_PROCESSES, JAX_PROCESS_ID"):
        launch_from_environment({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})


def test_non_integer_variables_are_refused():
    env = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"}
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' must be an integer"):
        launch_from_environment(env)


def test_process_id_out_of_range():
    env = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}
    with pytest.raises(ValueError, match=r"process_id 2 is outside \[0, 2\)"):
        launch_from_environment(env)


def test_skypilot_first_ip_coordinates():
    env = {
        "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2\n10.0.0.3\n",
        "SKYPILOT_NODE_RANK": "2",
        "SKYPILOT_NUM_NODES": "3",
    }
    launch = launch_from_environment(env, coordinator_port=9000)
    assert launch == LaunchSettings(
        coordinator_address="10.0.0.1:9000",
        num_processes=3,
        process_id=2,
        source="skypilot",
        node_addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3"),
        num_nodes=3,
    )
    assert launch.multi_node


def test_skypilot_inconsistent_or_partial():
    with pytest.raises(ValueError, match="without SKYPILOT_NODE_RANK"):
        launch_from_environment({"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2"})
    with pytest.raises(ValueError, match="SKYPILOT_NUM_NODES=3 disagrees"):
        launch_from_environment(
            {"SKYPILOT_NODE_IPS": "a\nb", "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "3"}
        )


@pytest.mark.parametrize(
    "env",
    [
        {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2"},
        {"SKYPILOT_NUM_NODES": "2"},
        {"SKYPILOT_NODE_RANK": "1"},
    ],
)
def test_skypilot_of_several_nodes_without_their_ips_is_refused(env):
    with pytest.raises(ValueError, match=r"SKYPILOT_NODE_IPS .* is not set"):
        launch_from_environment(env)


def test_skypilot_of_one_node_without_ips_is_not_a_launch():
    assert launch_from_environment({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1"}) is None


def test_skypilot_ipv6_gets_brackets():
    env = {"SKYPILOT_NODE_IPS": "fd00::1\nfd00::2", "SKYPILOT_NODE_RANK": "0"}
    assert launch_from_environment(env).coordinator_address == "[fd00::1]:8476"


def test_jax_variables_win_over_skypilot_but_keep_its_nodes():
    env = {
        "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1",
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "0",
        "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2",
        "SKYPILOT_NODE_RANK": "0",
    }
    with pytest.raises(ValueError, match="loopback"):
        launch_from_environment(env)


def test_slurm_leaves_the_coordinator_to_jax():
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_NODELIST": "node[001-002]",
        "SLURM_NTASKS": "8",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NUM_NODES": "2",
    }
    assert launch_from_environment(env) == LaunchSettings(
        coordinator_address=None, num_processes=8, process_id=5, source="slurm", num_nodes=2
    )


def test_slurm_allocation_outside_a_step_is_not_a_launch():
    # salloc sets the job and its task count, but only srun starts the tasks.
    assert launch_from_environment({"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4"}) is None


def test_an_srun_task_with_partial_step_variables_is_refused_naming_the_missing_one():
    env = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}
    with pytest.raises(ValueError, match=r"SLURM_PROCID=1 .* but SLURM_STEP_NODELIST is not set"):
        launch_from_environment(env)
    # task 0 reads like a batch script's own process, which is not a launch
    assert launch_from_environment({**env, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}) is None


def test_modal_cluster_refuses_one_string_of_addresses():
    with pytest.raises(TypeError, match=r"one string; .* e\.g\. \['10\.0\.0\.1'\]"):
        launch_from_modal_cluster(rank=0, container_ips="10.0.0.1")


def test_modal_cluster():
    launch = launch_from_modal_cluster(rank=1, container_ips=["10.1.0.1", "10.1.0.2"])
    assert (launch.coordinator_address, launch.process_id, launch.num_processes, launch.source) == (
        "10.1.0.1:8476",
        1,
        2,
        "modal",
    )
    with pytest.raises(ValueError, match="no container addresses"):
        launch_from_modal_cluster(rank=0, container_ips=[])


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "localhost", "[::1]"])
def test_loopback_across_nodes_is_refused(host):
    with pytest.raises(ValueError, match="loopback address") as info:
        LaunchSettings(
            coordinator_address=f"{host}:1234",
            num_processes=2,
            process_id=0,
            source="argument",
            node_addresses=("10.0.0.1", "10.0.0.2"),
        )
    assert "10.0.0.1, 10.0.0.2" in str(info.value)


def test_loopback_with_a_node_count_is_refused():
    with pytest.raises(ValueError, match="spans 2 nodes"):
        LaunchSettings(
            coordinator_address="localhost:1",
            num_processes=4,
            process_id=0,
            source="slurm",
            num_nodes=2,
        )


def test_loopback_on_one_node_is_fine():
    launch = LaunchSettings(
        coordinator_address="127.0.0.1:1",
        num_processes=2,
        process_id=1,
        source="argument",
        node_addresses=("10.0.0.1", "10.0.0.1"),
    )
    assert not launch.multi_node


@pytest.mark.parametrize("address", ["10.0.0.1", "10.0.0.1:port", ":80", "fd00::1:80"])
def test_coordinator_must_be_host_and_port(address):
    with pytest.raises(ValueError, match="must be host:port"):
        coordinator_host(address)


@pytest.mark.parametrize("address", ["127.0.0.1:0", "127.0.0.1:99999", "[fd00::1]:65536"])
def test_a_port_no_peer_can_reach_is_refused_at_once(address):
    with pytest.raises(ValueError, match=r"needs a port from 1 to 65535"):
        coordinator_host(address)


def test_counts_are_checked():
    with pytest.raises(ValueError, match="num_processes=0 must be an integer >= 1"):
        LaunchSettings(coordinator_address=None, num_processes=0, process_id=0, source="argument")
    with pytest.raises(TypeError, match="process_id=True must be an integer, not bool"):
        LaunchSettings(
            coordinator_address=None, num_processes=2, process_id=True, source="argument"
        )


def test_arguments_read_launcher_nodes():
    env = {"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NODE_RANK": "1"}
    launch = launch_from_arguments(
        env, coordinator_address="10.0.0.1:5", num_processes=2, process_id=1
    )
    assert launch.node_addresses == ("10.0.0.1", "10.0.0.2")
    assert with_port("10.0.0.1", 5) == "10.0.0.1:5"
