"""`--shard K/N`: every scenario in exactly one shard, the same split in every process, roughly even."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.input.scenario_file import default_files, default_mutant_files, load_files
from harness.input.shard import Shard, parse_shard, select, shard_of
from harness.records.errors import InputError
from tests.support.paths import ROOT

NAMES = [s.name for s in load_files(default_files() + default_mutant_files())]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 16])
def test_every_scenario_is_in_exactly_one_shard(count):
    shards = [Shard(k, count) for k in range(1, count + 1)]
    for name in NAMES:
        assert sum(s.holds(name) for s in shards) == 1, name
    assert sorted(n for s in shards for n in s.split(NAMES, str)[0]) == sorted(NAMES)


def test_the_split_is_the_same_in_another_process_whatever_its_hash_seed():
    # Python's hash() of a str changes with PYTHONHASHSEED; a matrix job's split must not.
    code = ("import sys; from harness.input.shard import shard_of; "
            "print(' '.join(str(shard_of(n, 3)) for n in sys.argv[1:]))")
    here = " ".join(str(shard_of(n, 3)) for n in NAMES)
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code, *NAMES], capture_output=True, text=True, env=env,
                             check=True, cwd=ROOT).stdout.strip()
        assert out == here


def test_the_hash_is_pinned():
    # The split is part of what a shard's results.json means: the same names must land in the same
    # shards in every build, or shards of a run and a re-run of one of them would overlap.
    names = ("attention-full-none", "tiny-full-none", "a")
    assert [shard_of(n, 4) for n in names] == [2, 1, 3]
    assert [shard_of(n, 7) for n in names] == [7, 6, 5]
    assert shard_of("tiny-full-none", 2) == shard_of("tiny-full-final_event", 2) == 1


def test_two_shards_of_the_bundled_set_are_roughly_even():
    first, second = Shard(1, 2).split(NAMES, str)
    assert len(first) + len(second) == len(NAMES)
    assert 0.4 <= len(first) / len(NAMES) <= 0.6, (len(first), len(second))


def test_a_shard_keeps_the_order_given():
    mine, others = Shard(1, 2).split(NAMES, str)
    assert mine == [n for n in NAMES if n in set(mine)] and others == [n for n in NAMES if n in set(others)]


@pytest.mark.parametrize("text, shard", [("1/2", Shard(1, 2)), ("2/2", Shard(2, 2)), ("1/1", Shard(1, 1)),
                                         (" 3 / 8 ", Shard(3, 8))])
def test_parse(text, shard):
    assert parse_shard(text) == shard and str(shard) == text.replace(" ", "")


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "0/0", "2", "1/2/3", "a/b", "-1/2", "1.5/2", "", "1 2"])
def test_a_bad_shard_says_what_is_valid(text):
    with pytest.raises(ValueError, match=r"expected K/N with whole numbers 1 <= K <= N, e.g. 1/2, got "):
        parse_shard(text)


def test_an_empty_shard_is_bad_input_that_says_how_many_there_are():
    names = ["tiny-full-none", "tiny-full-final_event"]  # both in shard 1 of 2
    assert select(names, Shard(1, 2), str) == names
    with pytest.raises(InputError) as e:
        select(names, Shard(2, 2), str)
    assert str(e.value) == ("--shard: shard 2/2 holds none of the 2 selected scenarios; a shard that tests "
                            "nothing must not pass: use fewer shards")
    assert e.value.exit_code == 2
