"""Secure aggregation read for what it is: Flower's SecAgg+ (legacy workflow, ``secaggplus_mod``) run in process on
the quickstart CNN with ``capture_mod`` outside the SecAgg+ mod. Every stage of every node is kept; the aggregate is
rebuilt from the masked vectors and the unmask stage's shares with Flower's primitives and equals the server's
(and the next round's broadcast), with a client lost mid-round too; no per-client figure comes from a masked
vector; the verdict speaks of the aggregate."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fedvit
from fedvit.audit.secagg import COLLECT, SETUP, UNMASK, rebuild, secagg_rounds
from fedvit.audit.summary import AGGREGATE_ROW, MASKED
from fedvit.capture.reader import load_exchanges
from tests.report_checks import check_markdown
from tests.secagg_harness import APP, run_secagg


@pytest.mark.parametrize("drop", [None, (1, 1)], ids=["all-survive", "one-lost-in-round-1"])
def test_the_aggregate_is_rebuilt_as_the_server_computes_it(tmp_path, drop):
    models = run_secagg(tmp_path / "cap", num_nodes=4, rounds=2, drop=drop)
    exchanges, skipped = load_exchanges(tmp_path / "cap")
    rounds, rest = secagg_rounds(exchanges)
    assert rest == [] and [r.round for r in rounds] == [1, 2]
    for found, model in zip(rounds, models, strict=True):
        assert found.sampled == [1000, 1001, 1002, 1003]
        assert all({SETUP, "share_keys"} <= set(found.stages[n]) for n in found.sampled)
        lost = drop is not None and found.round == drop[1]
        assert found.replied(COLLECT) == ([1000, 1002, 1003] if lost else found.sampled)
        assert found.replied(UNMASK) == found.replied(COLLECT)
        rebuilt = rebuild(found)
        assert max(float(np.abs(a - b).max()) for a, b in zip(rebuilt, model, strict=True)) < 1e-9
    for a, b in zip(rounds[1].broadcast, models[0], strict=True):  # FedAvg sends the aggregate on
        np.testing.assert_array_equal(a, b)
    assert skipped == (["node-1001~3 round 1: the reply was an error"] if drop else [])

    tampered = rounds[0]  # fewer shares than the threshold: said, never guessed
    for node in tampered.replied(UNMASK)[1:]:
        del tampered.stages[node][UNMASK]
    with pytest.raises(ValueError, match="the threshold is 2"):
        rebuild(tampered)


def test_the_audit_names_secagg_measures_no_masked_vector_and_audits_the_aggregate(tmp_path):
    run_secagg(tmp_path / "cap", num_nodes=4, rounds=2, drop=(1, 1))
    result = fedvit.audit_captures(
        tmp_path / "cap", out=tmp_path / "out", model="cnnapp.task:Net", app_dir=str(APP),
        data="cnnapp_partitions:partition", decoy_partitions="4-39", membership_references=3, iterations=20,
        restarts=1, max_seconds=20,
    )  # fmt: skip
    report = result.report
    assert result.verdict.startswith("SecAgg+: the 4 clients' updates are masked"), result.verdict
    assert len(result.verdict.splitlines()) <= 3
    secure = report["secure-aggregation"]
    assert secure["protocol"].startswith("SecAgg+") and "plaintext" in secure["observers"] and "TLS" in secure["tls"]
    first, second = secure["rounds"]
    assert first["dropped"] == [1001] and first["aggregate"].startswith("rebuilt")
    assert first["next-broadcast-max-difference"] == 0.0
    assert [u["node"] for u in report["updates"]] == ["aggregate", "aggregate"]  # no update of a masked vector
    rows = {c.client: c for c in result.clients}
    assert list(rows)[0] == AGGREGATE_ROW
    # each member takes one local step from the same broadcast: the aggregate's head change is one step over the
    # union, so its label counts are exact (simulating one client holding the union, 2 steps of 4, misfit here)
    labels = rows[AGGREGATE_ROW].labels
    assert labels.word == "leaks" and labels.figure.startswith("error 0.0%"), labels
    for name in ("partition 0", "partition 1", "partition 2", "partition 3"):
        found = rows[name].by_kind()
        assert {found[kind].why for kind in ("labels", "images", "DP claim")} == {MASKED}, name  # from its vector
        # its own images in the aggregates it joined, judged against their own null
        assert found["membership"].figure.startswith("its images in the aggregate: AUC"), found["membership"]
        assert found["membership"].word in ("leaks", "no evidence", "could not have seen", "not resolvable")
    audited = json.loads((tmp_path / "out" / "audit.json").read_text())["updates"]
    assert sorted(audited[0]["membership-members"]) == ["partition 0", "partition 2", "partition 3"]  # 1 was lost
    assert sorted(audited[1]["membership-members"]) == ["partition 0", "partition 1", "partition 2", "partition 3"]
    assert [audited[0]["membership-members"][f"partition {p}"]["members"] for p in (0, 2, 3)] == [1, 3, 4]
    truth = json.loads((tmp_path / "out" / "audit.json").read_text())["updates"][0]["leakage"]["membership"]
    assert truth["members"] == 1 + 3 + 4  # round 1: the survivors' images (partition 1 lost) are the members
    text = (tmp_path / "out" / "audit.md").read_text()
    assert "## Secure aggregation" in text and "1 dropped: 1001" in text
    check_markdown(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "audit.json").read_text())["secure-aggregation"]["rounds"][1]["dropped"] == []
