#!/usr/bin/env python3
"""
Helper for run_suite.sh.

  peer_score.py select  BASELINE.json OUT_FILE     -> write baseline-passing node ids (one per line)
  peer_score.py score   BASELINE.json OUTCOMES.json OUTCOMES.jsonl [SUMMARY_OUT.json]
                                                    -> print the score line
  peer_score.py baseline OUTCOMES.json OUTCOMES.jsonl BASELINE_OUT.json [server_bin]
                                                    -> write baseline.json from a run
  peer_score.py merge   BASELINE.json RECHECK1.outcomes.json [RECHECK2.outcomes.json ...]
                                                    -> promote tests that passed in every recheck
"""

import collections
import datetime
import json
import os
import sys

OUTCOMES = ("passed", "failed", "error", "skipped")


def load_outcomes(json_path: str, jsonl_path: str):
    """outcomes.json is written at session end; outcomes.jsonl incrementally (survives a kill)."""
    tests, messages, deselected = {}, {}, []
    if jsonl_path and os.path.exists(jsonl_path):
        with open(jsonl_path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                tests[rec["nodeid"]] = rec["outcome"]
                if rec.get("message"):
                    messages[rec["nodeid"]] = rec["message"]
    if json_path and os.path.exists(json_path):
        with open(json_path) as f:
            data = json.load(f)
        tests.update(data.get("tests", {}))
        messages.update(data.get("messages", {}))
        deselected = data.get("deselected", [])
    return tests, messages, deselected


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def cmd_select(baseline_path: str, out_path: str) -> None:
    with open(baseline_path) as f:
        base = json.load(f)
    flaky = set(base.get("flaky", []))
    ids = sorted(k for k, v in base["tests"].items() if v == "passed" and k not in flaky)
    with open(out_path, "w") as f:
        f.write("\n".join(ids) + "\n")
    print(f"selected {len(ids)} baseline-passing tests", file=sys.stderr)


def cmd_score(baseline_path, json_path, jsonl_path, summary_out=None) -> None:
    with open(baseline_path) as f:
        base = json.load(f)
    flaky = set(base.get("flaky", []))
    wanted = sorted(k for k, v in base["tests"].items() if v == "passed" and k not in flaky)
    tests, messages, _ = load_outcomes(json_path, jsonl_path)
    counts = collections.Counter()
    per_file = collections.defaultdict(collections.Counter)
    for nid in wanted:
        o = tests.get(nid, "not_run")
        counts[o] += 1
        per_file[file_of(nid)][o] += 1
    B = len(wanted)
    P = counts["passed"]
    F = counts["failed"] + counts["error"] + counts["not_run"]
    S = counts["skipped"]
    # per-file detail first, the score line last
    for fn in sorted(per_file):
        c = per_file[fn]
        tot = sum(c.values())
        extra = ", ".join(f"{k}={c[k]}" for k in ("failed", "error", "skipped", "not_run") if c[k])
        print(f"  {fn}: {c['passed']}/{tot}" + (f" ({extra})" if extra else ""))
    if counts["error"] or counts["not_run"]:
        print(
            f"  (failed count includes {counts['error']} errors and {counts['not_run']} tests that did not run)"
        )
    if summary_out:
        with open(summary_out, "w") as f:
            json.dump(
                {
                    "baseline_passing": B,
                    "passed": P,
                    "failed": counts["failed"],
                    "error": counts["error"],
                    "not_run": counts["not_run"],
                    "skipped": S,
                    "per_file": {k: dict(v) for k, v in per_file.items()},
                    "tests": {nid: tests.get(nid, "not_run") for nid in wanted},
                    "messages": {nid: messages[nid] for nid in wanted if nid in messages},
                },
                f,
                indent=1,
                sort_keys=True,
            )
    print(f"peer-suite: {P} passed of {B} baseline-passing tests ({F} failed, {S} skipped)")


def cmd_baseline(json_path, jsonl_path, out_path, server_bin=None) -> None:
    tests, messages, deselected = load_outcomes(json_path, jsonl_path)
    per_file = collections.defaultdict(collections.Counter)
    for nid, o in tests.items():
        per_file[file_of(nid)][o] += 1
    total = collections.Counter(tests.values())
    summary = {
        fn: {k: per_file[fn].get(k, 0) for k in OUTCOMES} | {"total": sum(per_file[fn].values())}
        for fn in sorted(per_file)
    }
    data = {
        "generated": datetime.datetime.now().isoformat(timespec="seconds"),
        "server_bin": server_bin,
        "selection": '-m "not slow" (slow-marked tests deselected)',
        "totals": {k: total.get(k, 0) for k in OUTCOMES}
        | {"total": len(tests), "deselected_slow": len(deselected)},
        "summary_per_file": summary,
        "tests": dict(sorted(tests.items())),
        "messages": dict(sorted(messages.items())),
        "deselected": sorted(deselected),
    }
    with open(out_path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"baseline written to {out_path}: {data['totals']}")


def cmd_merge_rechecks(baseline_path, recheck_paths) -> None:
    """Re-runs of the baseline's non-passing tests (same real server, quiet machine).
    A test the full run failed is promoted to 'passed' only if it passed in every recheck;
    if it passed in some but not all it is listed as 'flaky' (not counted)."""
    with open(baseline_path) as f:
        base = json.load(f)
    runs = [load_outcomes(p, p[: -len(".json")] + ".jsonl")[0] for p in recheck_paths]
    promoted, flaky = [], []
    for nid, o in list(base["tests"].items()):
        if o == "passed":
            continue
        res = [r.get(nid) for r in runs]
        if all(x == "passed" for x in res):
            promoted.append(nid)
            base["tests"][nid] = "passed"
            base["messages"].pop(nid, None)
        elif any(x == "passed" for x in res):
            flaky.append(nid)
    per_file = collections.defaultdict(collections.Counter)
    for nid, o in base["tests"].items():
        per_file[file_of(nid)][o] += 1
    base["summary_per_file"] = {
        fn: {k: per_file[fn].get(k, 0) for k in OUTCOMES} | {"total": sum(per_file[fn].values())}
        for fn in sorted(per_file)
    }
    total = collections.Counter(base["tests"].values())
    base["totals"] = {k: total.get(k, 0) for k in OUTCOMES} | {
        "total": len(base["tests"]),
        "deselected_slow": len(base.get("deselected", [])),
    }
    base["rechecks"] = {
        "runs": recheck_paths,
        "rule": "non-passing tests of the full run were re-run in isolation; promoted to passed "
        "only when they passed in every recheck (their full-run failure was a CPU-contention timeout)",
        "promoted_to_passed": sorted(promoted),
        "flaky_not_counted": sorted(flaky),
    }
    base["flaky"] = sorted(set(base.get("flaky", [])) | set(flaky))
    with open(baseline_path, "w") as f:
        json.dump(base, f, indent=1)
    print(f"promoted {len(promoted)}, flaky {len(flaky)}; totals now {base['totals']}")


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    cmd = argv[1]
    if cmd == "select":
        cmd_select(argv[2], argv[3])
    elif cmd == "score":
        cmd_score(argv[2], argv[3], argv[4], argv[5] if len(argv) > 5 else None)
    elif cmd == "merge":
        cmd_merge_rechecks(argv[2], argv[3:])
    elif cmd == "baseline":
        cmd_baseline(argv[2], argv[3], argv[4], argv[5] if len(argv) > 5 else None)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
