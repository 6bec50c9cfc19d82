"""The sanitizer's cost benchmark: its rounds, its summary and its verdict check, with no GPU."""

from __future__ import annotations

import json

import pytest

from harness.frontends import cli
from harness.studies import sanitizer_cost
from harness.studies.sanitizer_cost import Cost, Sample, measure_rounds


def fake_run(plain_ms: float, sanitized_ms: float, races: int):
    calls: list[bool] = []

    def run(sanitized: bool) -> Sample:
        calls.append(sanitized)
        return Sample(sanitized_ms, 0, races) if sanitized else Sample(plain_ms, 3)

    return run, calls


def test_rounds_alternate_which_side_runs_first_and_pair_plain_with_sanitized():
    run, calls = fake_run(2.0, 5.0, 1)
    pairs = measure_rounds(run, 4)
    assert calls == [False, True, True, False, False, True, True, False]
    assert all(p.races is None and s.races == 1 for p, s in pairs)


def test_the_cost_is_the_ratio_round_by_round_and_the_medians_difference():
    rounds = [(Sample(2.0, 1), Sample(4.0, 1, 1)), (Sample(1.0, 1), Sample(3.0, 1, 1)),
              (Sample(2.0, 0), Sample(5.0, 0, 1))]
    c = Cost.of("hybrid-full-none", 30, rounds)
    assert c.racy and c.plain.median == 2.0 and c.sanitized.median == 4.0
    assert c.added_ms == pytest.approx(2.0)
    assert c.ratio.median == pytest.approx(2.5)  # 2, 3, 2.5: the rounds' own ratios, not 4 / 2
    assert c.races == (1, 1, 1) and c.stale == (1, 1, 0)
    assert c.agrees


@pytest.mark.parametrize(("case", "races", "agrees"), [
    ("example:none", (1, 1), True),
    ("example:none", (1, 0), False),  # a round that missed the race
    ("hybrid-full-final_event", (0, 0), True),
    ("hybrid-full-final_event", (0, 2), False),  # a report on a fenced case
])
def test_the_verdict_check_fails_on_a_missed_race_and_on_a_false_report(case, races, agrees):
    c = Cost.of(case, 10, [(Sample(1.0, 0), Sample(2.0, 0, r)) for r in races])
    assert c.agrees is agrees
    assert c.line().endswith("| yes |" if agrees else "| NO |")


def test_a_case_with_no_rounds_does_not_agree():
    assert not Cost.of("example:none", 10, []).agrees


def test_its_row_is_json_and_its_line_a_table_row():
    c = Cost.of("example:event", 50, [(Sample(2.5, 0), Sample(3.0, 0, 0))] * 3)
    row = json.loads(json.dumps(c.row()))
    assert row["sanitized_ms"]["median"] == 3.0 and row["ratio"]["median"] == pytest.approx(1.2)
    assert row["agrees"] and row["rounds"] == 3
    assert c.line().startswith("| example:event | fenced | 50 x 3 | 2.500 (2.500-2.500) | 3.000")
    assert sanitizer_cost.HEADER.count("|") // 2 == c.line().count("|")


def test_with_no_gpu_it_says_so_and_succeeds(capsys, monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["sanitizer", "cost", "--out", str(tmp_path)]) == 0
    assert "no CUDA device" in capsys.readouterr().out


@pytest.mark.parametrize("arg", ["--rounds", "--replays", "--example-replays"])
def test_a_count_that_is_not_positive_is_one_line_and_exit_two(arg, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["sanitizer", "cost", arg, "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert arg in err and "expected a positive integer, got 0" in err


def test_a_sanitized_run_is_timed_inside_the_watch_and_carries_its_races(monkeypatch):
    import contextlib

    import harness.sanitizer.session as frontend

    inside: list[bool] = []
    watching = [False]

    @contextlib.contextmanager
    def fake_sanitize():
        watching[0] = True
        yield type("S", (), {"races": ["a", "b"]})()
        watching[0] = False

    monkeypatch.setattr(frontend, "sanitize", fake_sanitize)

    def timed() -> Sample:
        inside.append(watching[0])
        return Sample(2.0, 1)

    once = sanitizer_cost._plain_and_sanitized(timed)
    assert once(False) == Sample(2.0, 1, None)
    assert once(True) == Sample(2.0, 1, 2)
    assert inside == [False, True]
