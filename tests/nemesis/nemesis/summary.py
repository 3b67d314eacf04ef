"""A check's result for people: the figures, what was skipped or not
checked, and each anomaly kind with its first counterexamples."""


def apply_known(result, known):
    """Marks anomalies of the kinds in `known` ({kind: why}) as known: they
    are kept and printed, but no longer fail the run."""
    result["known"] = [a for a in result["anomalies"] if a["kind"] in known]
    result["anomalies"] = [a for a in result["anomalies"] if a["kind"] not in known]
    result["known_reasons"] = {k: known[k] for k in {a["kind"] for a in result["known"]}}
    result["ok"] = not result["anomalies"]
    return result


def _by_kind(anomalies, lines, label, per_kind=3):
    kinds = {}
    for a in anomalies:
        kinds.setdefault(a["kind"], []).append(a)
    for kind, items in kinds.items():
        lines.append(f"  {label}{kind}: {len(items)}")
        for a in items[:per_kind]:
            lines.append(f"    {a['detail']}")
            for e in a.get("evidence", [])[:3]:
                lines.append(f"        {e}")


def summary(result):
    lines = []
    s = result.get("stats", {})
    total = sum(sum(v.values()) for v in s.get("operations", {}).values())
    lines.append(f"nemesis: {total} operations; faults {s.get('faults', {})}; at the end {s.get('database', {})}")
    lines.append(f"nemesis: recovery after each fault kind (s): {s.get('recovery', {})}")
    lines.append(f"nemesis: turns run again after an interruption: {s.get('turns_run_again_after_an_interruption', 0)}, "
                 f"reads with a lost answer: {s.get('indeterminate_reads', 0)}")
    for kind, reason in (result.get("skipped_faults") or {}).items():
        lines.append(f"SKIPPED fault {kind}: {reason}")
    for item in result.get("not_checked", []):
        lines.append(f"not checked: {item}")
    if result.get("known"):
        lines.append(f"nemesis: {len(result['known'])} known anomalies (tests/nemesis/known.json)")
        _by_kind(result["known"], lines, "KNOWN ", per_kind=1)
    if result["ok"]:
        lines.append("nemesis: no anomaly")
    else:
        lines.append(f"nemesis: {len(result['anomalies'])} anomalies")
        _by_kind(result["anomalies"], lines, "")
    return "\n".join(lines)
