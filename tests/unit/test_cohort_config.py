"""One configuration per generation (issue #37): a cohort's configuration digest in its units, the slot that names
the configuration a launch starts from, a node's refusal to start its rank from another one, the records of what
each node's rank runs, and the driver's declaration of a generation whose ranks run two (a mixed cohort). Pure
decisions and rendering: no process, no etcd, no testbed."""

from __future__ import annotations

import json

import pytest

from shadowline.common.coordination import (
    FAILED,
    LAUNCHING,
    RUNNING,
    SLOT_SCHEMA,
    Keys,
    RankRecord,
    RecordInvalid,
    Slot,
    agent_instance,
)
from shadowline.common.etcd_client import KV
from shadowline.common.policy import CONFIG_MISMATCH, MIXED_CONFIGURATION, NODE_FENCED
from shadowline.control.actions import Declare, Launch, LaunchFailed, NoteMixed, PublishRank, Record, SwapSlot
from shadowline.control.driver_duties import mixed_generations, relaunch_due, unfenced_due
from shadowline.control.memory import DriverMemory, Start
from shadowline.control.node_duties import launch_due, publish_due, start_progress, start_refusal
from shadowline.control.observe import environment_value
from shadowline.control.view import DeploymentView, SlotEntry, parse_view
from shadowline.deployment import units

from .test_agent_driver import HOSTS, POLICY
from .test_agent_node import NOW, memory, rank
from .test_plan import plan_for

OLD, NEW = "a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2"
PRESENT = {host: agent_instance(1000 + i, 7_000_000 + i) for i, host in enumerate(HOSTS)}  # each node's agent now
EARLIER = {host: agent_instance(900 + i, 6_000_000 + i) for i, host in enumerate(HOSTS)}  # the agent before it


def view(*slots: Slot, ranks: dict[int, dict[str, RankRecord]] | None = None, gone: dict | None = None,
         fenced: dict | None = None, agents: dict[str, str] | None = None) -> DeploymentView:
    agents = PRESENT if agents is None else agents
    return DeploymentView(slots={s.cohort: SlotEntry(s, 10 + s.cohort) for s in slots}, agents=frozenset(agents),
                          agent_instances=agents, ranks=ranks or {}, gone=gone or {}, fenced=fenced or {})


def by(who: dict[str, str], **records: tuple[int, str]) -> dict[str, RankRecord]:
    """Rank records per node, each written by that node's agent in ``who``."""
    return {host: RankRecord(generation, config, 0, who[host]) for host, (generation, config) in records.items()}


# --- the digest, in every rank's unit ---------------------------------------------------------------------------
def test_every_nodes_dropin_carries_its_cohorts_digest_and_it_changes_with_any_nodes_command():
    plan = plan_for(3, gms_engine={"tensor_parallel_size": 3})
    digests = {units.installed_config(units.engine_dropin(plan, host, c)) for host in plan.hosts for c in (0,)}
    assert digests == {units.cohort_config(plan, 0)}, "one digest for the cohort on every node"
    assert units.cohort_config(plan, 0) != units.cohort_config(plan, 1), "each cohort has its own"
    other = plan_for(3, gms_engine={"tensor_parallel_size": 3, "extra_args": ["--max-model-len", "2048"]})
    assert units.cohort_config(other, 0) != units.cohort_config(plan, 0)
    assert units.cohort_config(plan_for(3, gms_engine={"tensor_parallel_size": 3}), 0) == units.cohort_config(plan, 0)


def test_the_digest_is_read_back_from_a_units_environment_and_a_dropin():
    assert environment_value(["HOME=/x", f"{units.CONFIG_ENV}={NEW}", "A=b"], units.CONFIG_ENV) == NEW
    assert environment_value(["HOME=/x"], units.CONFIG_ENV) == ""
    assert units.installed_config("[Service]\nEnvironment=\"HOME=/x\"\n") == ""


# --- the slot's configuration ------------------------------------------------------------------------------------
def test_a_slot_carries_its_configuration_and_an_older_record_without_one_still_reads():
    slot = Slot(cohort=1, generation=4, state=LAUNCHING, config=NEW)
    data = json.loads(slot.to_json())
    assert data["schema"] == SLOT_SCHEMA == 3 and data["config"] == NEW and data["replica"] == 0
    assert Slot.parse(slot.to_json()) == slot
    old = {"schema": 1, "cohort": 1, "generation": 4, "state": "running"}
    assert Slot.parse(json.dumps(old)).config == ""
    with pytest.raises(RecordInvalid, match="config"):
        Slot.parse(json.dumps({**old, "config": 7}))


def test_rank_records_are_parsed_into_the_view_and_broken_ones_ignored():
    keys = Keys("demo", 0)
    good = KV(keys.rank(1, "node2"), RankRecord(4, NEW, 77, PRESENT["node2"]).to_json().encode(), 5, 5, 0)
    older = KV(keys.rank(0, "node2"), json.dumps({"generation": 3, "config": OLD, "pid": 5}).encode(), 5, 5, 0)
    bad = KV(keys.rank(1, "node1"), b"{}", 6, 6, 0)
    presence = KV(keys.agent("node2"), json.dumps({"pid": 1, "since": 2.0, "instance": PRESENT["node2"]}).encode(),
                  7, 7, 0)
    before = KV(keys.agent("node1"), json.dumps({"pid": 1, "since": 2.0}).encode(), 7, 7, 0)  # an older agent's
    parsed = parse_view(keys, [good, older, bad, presence, before], frozenset({0, 1}))
    assert parsed.ranks == {1: {"node2": RankRecord(4, NEW, 77, PRESENT["node2"])}, 0: {"node2": RankRecord(3, OLD, 5)}}
    assert keys.rank(1, "node1") in parsed.invalid
    assert parsed.agent_instances == {"node2": PRESENT["node2"], "node1": ""}


# --- a node's start: only from the generation's configuration -------------------------------------------------------
@pytest.mark.parametrize(("expected", "installed", "refused"), [
    (NEW, NEW, ""),
    ("", OLD, ""),  # a slot of an older agent: whatever the unit holds
    (NEW, OLD, "the unit holds configuration a1a1"),
    (NEW, "", "the unit holds configuration (none)"),
])
def test_a_node_starts_its_rank_only_from_the_configuration_the_generation_was_launched_with(
        expected, installed, refused):
    why = start_refusal(expected, installed)
    assert (why == "") == (refused == "") and refused in why


def test_the_launch_takes_the_slots_configuration():
    launching = Slot(cohort=1, generation=5, state=LAUNCHING, config=NEW, not_before=NOW.wall - 1)
    assert Launch(1, 5, NEW) in launch_due(launching, memory(), NOW)


def test_a_refused_start_declares_its_generation_failed_for_its_configuration():
    start = Start(generation=5, since=NOW.mono - 0.1, refused="the unit holds configuration a1a1a1a1a1a1a1a1")
    actions = start_progress(1, start, None, None, NOW)
    assert [type(a) for a in actions] == [LaunchFailed, Declare]
    assert actions[1].reason == CONFIG_MISMATCH and actions[1].generation == 5
    assert "a1a1" in actions[0].failure


# --- what each node's rank runs, in etcd ---------------------------------------------------------------------------
def test_each_rank_is_published_once_with_its_generation_configuration_and_agent():
    node = memory(rank(0, 3), rank(1, 4))
    node.instance = PRESENT["node0"]
    node.ranks[0].config, node.ranks[1].config = OLD, NEW
    assert publish_due(view(), node, "node0") == [PublishRank(0, 3, OLD, 4242), PublishRank(1, 4, NEW, 4243)]
    written = view(ranks={0: by(PRESENT, node0=(3, OLD)), 1: by(PRESENT, node0=(3, NEW))})
    assert publish_due(written, node, "node0") == [PublishRank(1, 4, NEW, 4243)], "only the one etcd lacks"
    node.published[1] = (4, NEW)
    assert publish_due(written, node, "node0") == [], "written already, the view not back yet"
    node.ranks[0].generation = 0  # adopted, generation not known yet
    assert publish_due(view(), memory(), "node0") == []


def test_an_agent_writes_again_what_the_agent_before_it_wrote():
    """The same generation and configuration, in a record of a stopped agent: this agent's own record replaces it
    (the driver takes only the present agent's word)."""
    node = memory(rank(1, 4))
    node.instance, node.ranks[1].config = PRESENT["node0"], NEW
    assert publish_due(view(ranks={1: by(EARLIER, node0=(4, NEW))}), node, "node0") == [PublishRank(1, 4, NEW, 4243)]


# --- the driver: a mixed generation is declared failed, once ------------------------------------------------------
MIXED_CASES = [
    # (the ranks' records, each node's present agent, declared?)
    (by(PRESENT, node0=(4, NEW), node1=(4, OLD), node2=(4, OLD)), PRESENT, True),
    (by(PRESENT, node0=(4, NEW), node1=(4, NEW), node2=(4, NEW)), PRESENT, False),
    (by(PRESENT, node0=(4, NEW), node1=(3, OLD)), PRESENT, False),  # a late record of the generation before
    (by(PRESENT, node0=(4, NEW)), PRESENT, False),  # the others not started yet
    (by(PRESENT, node0=(4, NEW), node1=(4, "")), PRESENT, False),  # a rank of an older agent: unknown
    (by(PRESENT, node0=(5, NEW), node1=(5, OLD)), PRESENT, False),  # not the slot's generation
    # an upgrade: node0's agent is back and wrote its restarted rank; node1's and node2's records are their stopped
    # agents' (the ranks the playbook restarted since run the new configuration): not a mixed generation (CI, #37)
    ({**by(PRESENT, node0=(4, NEW)), **by(EARLIER, node1=(4, OLD), node2=(4, OLD))}, PRESENT, False),
    # the same while node1's and node2's agents are still stopped (their presence gone)
    ({**by(PRESENT, node0=(4, NEW)), **by(EARLIER, node1=(4, OLD), node2=(4, OLD))}, {"node0": PRESENT["node0"]},
     False),
    # a record without its writer's name (an agent before this check) is nobody's word
    ({**by(PRESENT, node0=(4, NEW)), "node1": RankRecord(4, OLD)}, PRESENT, False),
    # node1's agent is back and wrote its own: the generation is mixed
    ({**by(PRESENT, node0=(4, NEW), node1=(4, OLD)), **by(EARLIER, node2=(4, NEW))}, PRESENT, True),
]


@pytest.mark.parametrize(("records", "agents", "declared"), MIXED_CASES)
@pytest.mark.parametrize("state", [RUNNING, LAUNCHING])
def test_a_generation_whose_ranks_run_two_configurations_is_declared_failed(records, agents, declared, state):
    actions = mixed_generations(view(Slot(cohort=1, generation=4, state=state), ranks={1: records}, agents=agents),
                                DriverMemory())
    declarations = [a for a in actions if isinstance(a, Declare)]
    assert bool(declarations) == declared
    if declared:
        assert declarations[0] == Declare(1, 4, MIXED_CONFIGURATION)
        assert declarations[0].evidence["configs"] in ({"node0": NEW, "node1": OLD, "node2": OLD},
                                                       {"node0": NEW, "node1": OLD})
        record = next(a for a in actions if isinstance(a, Record))
        assert record.event == MIXED_CONFIGURATION and "a1a1a1a1a1a1a1a1 on node1" in record.fields["detail"]
        assert NoteMixed(1, 4) in actions


def test_a_mixed_generation_is_declared_once_and_a_failed_one_never():
    records = {1: by(PRESENT, node0=(4, NEW), node1=(4, OLD))}
    assert mixed_generations(view(Slot(cohort=1, generation=4, state=RUNNING), ranks=records),
                             DriverMemory(mixed={(1, 4)})) == []
    assert mixed_generations(view(Slot(cohort=1, generation=4, state=FAILED), ranks=records), DriverMemory()) == []


def test_every_launch_the_driver_writes_names_the_configuration_of_its_units():
    failed = Slot(cohort=1, generation=4, state=FAILED, reason=MIXED_CONFIGURATION)
    gone = {(1, 4): {h: NOW.wall for h in HOSTS}}
    swap = relaunch_due(failed, 11, view(failed, gone=gone), HOSTS, DriverMemory(), memory(), POLICY, NOW, NEW)[-1]
    assert isinstance(swap, SwapSlot) and swap.slot.generation == 5 and swap.slot.config == NEW
    held = Slot(cohort=1, generation=4, state="dead", reason=NODE_FENCED)
    (swap,) = unfenced_due(held, 11, view(held), NOW, NEW)
    assert swap.slot.config == NEW
