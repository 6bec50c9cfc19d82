"""The tensor-parallel keys of a scenario file: `tp`, `fence_ranks`, the fault's `ranks`."""

import pytest

from harness.input.scenario_file import SCENARIO_DIR, load_file, parse_text
from harness.records.errors import InputError
from harness.records.ranks import CrossRank, RankReplay, RankTally, cross_rank
from harness.records.scenario import FaultKind
from harness.run.tp import rank_view

HEAD = """
[models.a]
layers = "AA"
hidden = 64
heads = 4
kv_heads = 2
head_dim = 16
"""


def one(extra: str, defaults: str = "") -> str:
    return (f"[defaults]\n{defaults}\n" if defaults else "") + HEAD + f"""
[[scenario]]
name = "s"
model = "a"
batch = [{{ prefix = 8, new = 2 }}]
backend = "full"
expect = "race"
{extra}
"""


def error(text: str) -> str:
    with pytest.raises(InputError) as info:
        parse_text(text, "tp.toml")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_tp_and_the_rank_selectors_load():
    (s,) = parse_text(one('tp = 2\nfence = "final_event"\nfence_ranks = [0]\nfault = { kind = "gate", ranks = [1] }'),
                      "tp.toml")
    assert (s.tp, s.fence_ranks, s.fault_ranks, s.fault.kind) == (2, (0,), (1,), FaultKind.GATE)
    assert "tp=2" in s.describe() and "fault_ranks=1" in s.describe()
    (plain,) = parse_text(one(""), "tp.toml")
    assert (plain.tp, plain.fence_ranks, plain.fault_ranks) == (1, None, None)


def test_a_faults_ranks_come_with_it_from_defaults_and_go_with_a_scenarios_own_fault():
    defaults = 'tp = 2\nfault = { kind = "gate", ranks = [1] }'
    (inherited,) = parse_text(one("", defaults), "tp.toml")
    assert inherited.fault_ranks == (1,) and inherited.fault.kind is FaultKind.GATE
    (own,) = parse_text(one('fault = { kind = "delay", us = 5 }', defaults), "tp.toml")
    assert own.fault_ranks is None  # its own fault, on every rank


@pytest.mark.parametrize("extra, key, says", [
    ("tp = 3", "scenario[0].tp", "unknown value 3; valid: 1, 2, 4, 8"),
    ('tp = "2"', "scenario[0].tp", "expected an integer, one of: 1, 2, 4, 8"),
    ("tp = 8", "scenario[0].tp", "heads (4) must be a multiple of tp (8)"),
    ('tp = 2\nfault = { kind = "gate", ranks = [2] }', "scenario[0].fault.ranks",
     "rank 2 is not a rank of tp = 2; valid: 0, 1"),
    ('tp = 2\nfault = { kind = "gate", ranks = [] }', "scenario[0].fault.ranks", "an empty array selects no rank"),
    ("tp = 2\nfence_ranks = [0, 0]", "scenario[0].fence_ranks", "the same rank appears twice"),
    ("fence_ranks = [0]", "scenario[0].fence_ranks", "it needs tp > 1"),
    ('tp = 2\nfault = { kind = "sweep", points = [0, 5] }', "scenario[0].tp", "a sweep runs on one rank"),
    ('tp = 2\nmodel = { layers = "AM" }', "scenario[0].tp", "Mamba layers are not split"),
])
def test_bad_tp_input_is_one_line_naming_file_key_and_what_is_valid(extra, key, says):
    text = one(extra) if "model =" not in extra else one(extra).replace('model = "a"\n', "")
    message = error(text)
    assert message.startswith(f"tp.toml: {key}: ") and says in message, message


def test_the_bundled_tp_set_runs_the_race_the_fix_and_the_one_rank_mutant():
    scenarios = {s.name: s for s in load_file(SCENARIO_DIR / "tp.toml")}
    assert all(s.tp == 2 and s.fault_ranks == (1,) for s in scenarios.values())
    mutant = scenarios["mutant.tp2.fence_on_rank0_only"]
    assert mutant.expect.value == "race" and mutant.evidence.value == "data" and mutant.fence_ranks == (0,)
    assert [rank_view(mutant, r).fence for r in (0, 1)] == ["final_event", "none"]
    assert [rank_view(mutant, r).fault.kind for r in (0, 1)] == [FaultKind.NONE, FaultKind.GATE]
    assert scenarios["correct.tp2.final_event_every_rank.gate-rank1"].fence_ranks is None


def test_the_cross_rank_verdict_names_the_stale_rank_and_where_the_all_reduce_carried_it():
    stale = RankReplay(stale_reads=True, output_differs=True, stale=True)
    carried = RankReplay(stale_reads=False, output_differs=True, stale=True)
    clean = RankReplay(False, False, False)
    tp = cross_rank([RankTally(0), RankTally(1)], [[carried, clean], [stale, clean]])
    assert tp.describe() == "stale reads on rank 1; carried to ranks 0,1 through the all-reduce"
    assert [t.carried_replays for t in tp.ranks] == [1, 0] and [t.stale_read_replays for t in tp.ranks] == [0, 1]
    kept = cross_rank([RankTally(0), RankTally(1)], [[clean], [stale]])
    assert kept.describe() == "stale reads on rank 1; not carried to the other ranks" and not kept.carried
    assert cross_rank([RankTally(0), RankTally(1)], [[clean], [clean]]).describe() == "no stale reads on any rank"
    failed = CrossRank(2, [RankTally(0, state="stopped"), RankTally(1, state="failed")])
    assert failed.describe() == "rank 0 stopped; rank 1 failed"
