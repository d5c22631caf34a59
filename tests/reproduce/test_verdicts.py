"""Three-valued verdicts: the rules on their own, then every target's criteria driven to each value
they can take from synthetic per-seed headlines (the numbers its analysis writes per seed)."""

import pytest

from testbed.reproduce import get_experiment, judge_seeds
from testbed.reproduce.verdict import EXCLUDED, Criterion, combine, judge

RATIO = Criterion("r", "a speed-up", "higher", neutral=1.0, bar=1.5, tie=0.05)
LIMIT = Criterion("gap", "accuracy given up (at most 1 point)", "lower", neutral=0.01, bar=0.01)


@pytest.mark.parametrize("values,verdict", [
    ([2.0, 1.8, 2.2], "holds"),  # every seed beyond 1, the mean clears 1.5
    ([2.0, 0.9, 2.2], "weak"),  # the mean clears the bar, one seed goes the other way
    ([1.3, 1.2, 1.25], "weak"),  # every seed faster, the mean short of the bar
    ([1.02, 0.99, 1.03], "tie"),  # the mean within 5% of no effect
    ([0.5, 0.8, 1.1], "does not hold"),  # the mean on the wrong side
    ([2.0, None, 2.2], "weak"),  # a seed that measured nothing counts against
    ([None, None, None], "does not hold"),
    ([2.0, EXCLUDED, 1.9], "holds"),  # a seed left out says nothing
    ([EXCLUDED, EXCLUDED], "not judged"),
])
def test_judge_rules(values, verdict):
    assert judge(RATIO, values).verdict == verdict


def test_judge_limits_and_the_spread():
    assert judge(LIMIT, [0.0, -0.01, 0.005]).verdict == "holds"
    assert judge(LIMIT, [0.0, 0.02, 0.005]).verdict == "weak"  # one seed gave up 2 points
    assert judge(LIMIT, [0.03, 0.02, 0.005]).verdict == "does not hold"
    j = judge(RATIO, [2.0, 1.0, 3.0])
    assert (j.mean, j.low, j.high) == (2.0, 1.0, 3.0) and j.verdict == "weak"
    with pytest.raises(ValueError, match="bar"):
        Criterion("x", "x", "higher", neutral=1.0, bar=0.5)


def test_a_ratios_mean_over_seeds_is_geometric():
    geo = Criterion("fig7", "buffer ratio", "higher", neutral=1.0, bar=2.0, tie=0.1, ratio=True)
    arith = Criterion("fig7", "buffer ratio", "higher", neutral=1.0, bar=2.0, tie=0.1)
    seeds = [1.65, 1.15, 3.41]  # arithmetic mean 2.07 clears 2, geometric 1.86 does not
    assert judge(arith, seeds).verdict == "holds"
    j = judge(geo, seeds)
    assert j.verdict == "weak" and j.mean == pytest.approx(1.8634, abs=1e-3) and "short of 2" in j.why
    assert judge(geo, [2.0, 0.5]).verdict == "tie"  # twice as fast, then half: no effect (arithmetic: 1.25x)
    assert judge(geo, [3.0, 0.0, 3.0]).values == (3.0, None, 3.0)  # a ratio of 0 measured nothing
    assert "the geometric mean >= 2" in geo.rule()


def test_combine_is_the_worst_and_not_judged_caps_at_weak():
    assert combine(["holds", "holds"]) == "holds"
    assert combine(["holds", "weak"]) == "weak"
    assert combine(["holds", "tie"]) == "tie"
    assert combine(["tie", "does not hold", "holds"]) == "does not hold"
    assert combine(["holds", "not judged"]) == "weak"
    assert combine(["not judged"]) == "not judged"


def _verdict(name, results):
    return judge_seeds(get_experiment(name), results, "ci")[0]


def _fig3(ratio, gap):
    return {"ingress_ratio_asgd_over_adacomp_0.01": ratio, "final_accuracy_gap": gap}


def test_fig_adacomp_3_verdicts():
    assert _verdict("fig-adacomp-3", [_fig3(30, 0.0), _fig3(25, -0.01), _fig3(40, 0.005)]) == "holds"
    # the mean clears 20x
    assert _verdict("fig-adacomp-3", [_fig3(30, 0.0), _fig3(15, -0.01), _fig3(40, 0.005)]) == "holds"
    assert _verdict("fig-adacomp-3", [_fig3(30, 0.0), _fig3(0.8, -0.01), _fig3(40, 0.005)]) == "weak"
    assert _verdict("fig-adacomp-3", [_fig3(12, 0.0), _fig3(15, 0.0), _fig3(18, 0.0)]) == "weak"  # below 20x
    assert _verdict("fig-adacomp-3", [_fig3(30, 0.03), _fig3(30, 0.02), _fig3(30, 0.0)]) == "does not hold"
    assert _verdict("fig-adacomp-3", [_fig3(0.8, 0.0)] * 3) == "does not hold"
    assert _verdict("fig-adacomp-3", [_fig3(None, 0.0)]) == "does not hold"  # AdaComp never reached it


def _table2(lost100, lost20, crashed=(7, 6), over_control=0.009):
    return {"accuracy_lost_to_crashes": {"100%": lost100, "20%": lost20}, "crashes_over_control": over_control,
            "crashed_workers": {"100% data, crashes": crashed[0], "20% data, crashes": crashed[1]}}


def test_table_adacomp_2_verdicts():
    assert _verdict("table-adacomp-2", [_table2(0.0, 0.005)] * 3) == "holds"
    assert _verdict("table-adacomp-2", [_table2(0.0, 0.005), _table2(0.0, 0.02), _table2(0.0, 0.0)]) == "weak"
    assert _verdict("table-adacomp-2", [_table2(0.05, 0.005)] * 3) == "does not hold"
    assert _verdict("table-adacomp-2", [_table2(0.0, 0.0, (0, 0))] * 3) == "does not hold"  # nothing crashed
    # the paper's control: crashes on 20% beat half the workers on 10% without crashes
    assert _verdict("table-adacomp-2", [_table2(0.0, 0.0, over_control=-0.01)] * 3) == "does not hold"
    assert _verdict("table-adacomp-2", [_table2(0.0, 0.0, over_control=0.003)] * 3) == "weak"  # short of half a point
    # a figure drawn before the control was judged: read from its rows
    old = {"accuracy_lost_to_crashes": {"100%": 0.0, "20%": 0.0}, "crashed_workers": {"x crashes": 4},
           "series": [{"series": "20% data, crashes", "max accuracy": 0.89},
                      {"series": "half the workers, 10% data, no crash", "max accuracy": 0.882}]}
    assert get_experiment("table-adacomp-2").metrics(old, "ci")["over_control"] == pytest.approx(0.008)


def _table6(speedup, drop=0.0, reached=True):
    return {"sets": [{"set": s, "speedup": speedup, "accuracy drop": drop, "DDL reached": reached}
                     for s in ("S1", "S2", "S1'", "S2'")]}


def test_table_scadles_6_verdicts():
    assert _verdict("table-scadles-6", [_table6(2.0), _table6(1.5), _table6(1.3)]) == "holds"
    assert _verdict("table-scadles-6", [_table6(2.0), _table6(0.9), _table6(1.3)]) == "weak"
    assert _verdict("table-scadles-6", [_table6(1.01)] * 3) == "tie"
    assert _verdict("table-scadles-6", [_table6(0.6)] * 3) == "does not hold"
    assert _verdict("table-scadles-6", [_table6(2.0, drop=-0.05)] * 3) == "does not hold"
    # DDL never reached the target: no speed-up claimed, so the set's speed-up is not judged
    assert _verdict("table-scadles-6", [_table6(None, reached=False)] * 3) == "weak"
    both = [_table6(2.0), _table6(None, reached=False)]
    assert _verdict("table-scadles-6", both) == "holds"


def _table4(reduction, fig7, reached=True):
    return {"sets": [{"set": s, "reduction": reduction, "DDL / ScaDLES (persistence)": fig7,
                      **{f"{w} reached": reached for w in ("DDL persistence", "DDL truncation",
                                                           "ScaDLES persistence")}}
                     for s in ("S1", "S2", "S1'", "S2'")]}


def test_table_scadles_4_verdicts():
    assert _verdict("table-scadles-4", [_table4(20, 3), _table4(15, 2.5), _table4(30, 4)]) == "holds"
    assert _verdict("table-scadles-4", [_table4(5, 3)] * 3) == "weak"  # truncation smaller, not 10x
    assert _verdict("table-scadles-4", [_table4(20, 0.5)] * 3) == "does not hold"  # ScaDLES holds more
    assert _verdict("table-scadles-4", [_table4(20, 3, reached=False)] * 3) == "not judged"


def _table5(rise, fall):
    return {"per_cr": {"0.1": {"cnc_rise": rise, "volume_ratio": fall},
                       "0.01": {"cnc_rise": rise, "volume_ratio": fall}}}


def test_table_scadles_5_verdicts():
    assert _verdict("table-scadles-5", [_table5(0.4, 2.7)] * 3) == "holds"
    # a flat CNC series no longer passes (the old check let b >= a - 0.05 through)
    assert _verdict("table-scadles-5", [_table5(0.0, 1.0)] * 3) == "tie"
    assert _verdict("table-scadles-5", [_table5(0.4, 0.8)] * 3) == "does not hold"  # volume rose
    assert _verdict("table-scadles-5", [_table5(0.05, 1.05)] * 3) == "weak"


def _selsync(speedup, diff=0.01, bsp_reached=True, fedavg=(-0.03, -0.02)):
    return {"bsp_reached": bsp_reached,
            "table": [{"method": "BSP", "speedup": 1.0, "diff vs BSP": 0.0}] +
                     [{"method": f"SelSync delta={d}", "speedup": speedup, "diff vs BSP": diff}
                      for d in ("0.3", "0.5")] +
                     [{"method": f"FedAvg C=0.5 E={e}", "speedup": 2.0, "diff vs BSP": f}
                      for e, f in zip(("0.25", "0.125"), fedavg)]}


def test_table_selsync_1_verdicts():
    assert _verdict("table-selsync-1", [_selsync(3.0), _selsync(2.5), _selsync(2.0)]) == "holds"
    assert _verdict("table-selsync-1", [_selsync(1.4)] * 3) == "weak"  # faster, under the paper's 1.67x
    assert _verdict("table-selsync-1", [_selsync(1.02)] * 3) == "tie"
    assert _verdict("table-selsync-1", [_selsync(0.7)] * 3) == "does not hold"
    assert _verdict("table-selsync-1", [_selsync(3.0, diff=-0.05)] * 3) == "does not hold"
    # FedAvg C=0.5 must miss BSP's accuracy by a point, judged on its better E
    assert _verdict("table-selsync-1", [_selsync(3.0, fedavg=(-0.03, 0.03))] * 3) == "does not hold"
    assert _verdict("table-selsync-1", [_selsync(3.0, fedavg=(-0.03, -0.007))] * 3) == "weak"  # misses, by < 1 point
    assert _verdict("table-selsync-1", [_selsync(3.0, fedavg=(0.0, -0.002))] * 3) == "tie"


def _adsp4(cut):
    return {"reduction_vs": {n: cut for n in ("BSP", "SSP s=3", "ASGD", "Fixed ADACOMM tau=8")}}


def test_fig_adsp_4_verdicts():
    assert _verdict("fig-adsp-4", [_adsp4(0.5), _adsp4(0.3), _adsp4(0.6)]) == "holds"
    assert _verdict("fig-adsp-4", [_adsp4(0.5), _adsp4(-0.2), _adsp4(0.6)]) == "weak"
    assert _verdict("fig-adsp-4", [_adsp4(0.01)] * 3) == "tie"
    assert _verdict("fig-adsp-4", [_adsp4(-0.3)] * 3) == "does not hold"
    assert _verdict("fig-adsp-4", [_adsp4(None)] * 3) == "does not hold"  # ADSP never got there


def test_fig_adsp_3_verdicts():
    def u(fall, rise):
        return {"falling_side": fall, "rising_side": rise}

    assert _verdict("fig-adsp-3", [u(1.3, 2.0), u(1.2, 1.8), u(1.4, 2.2)]) == "holds"
    assert _verdict("fig-adsp-3", [u(1.3, 2.0), u(0.9, 1.8), u(1.2, 2.2)]) == "weak"
    assert _verdict("fig-adsp-3", [u(1.01, 2.0)] * 3) == "tie"  # no falling side
    assert _verdict("fig-adsp-3", [u(0.7, 2.0)] * 3) == "does not hold"  # fewest commits fastest


def test_fig_dlion_verdicts():
    def f6(g, a, c):
        return {"reduction_to_first_target": {"Gaia": g, "Ako": a}, "capacity_aware_reduction_to_second_target": c}

    assert _verdict("fig-dlion-6", [f6(0.4, 0.3, 0.2), f6(0.3, 0.2, 0.15), f6(0.35, 0.25, 0.3)]) == "holds"
    assert _verdict("fig-dlion-6", [f6(0.4, 0.3, 0.2), f6(0.3, 0.2, -0.2), f6(0.35, 0.25, 0.3)]) == "weak"
    assert _verdict("fig-dlion-6", [f6(0.4, 0.3, -0.2)] * 3) == "does not hold"

    def f7(g, a):
        return {"accuracy_above": {"Gaia": g, "Ako": a}}

    assert _verdict("fig-dlion-7", [f7(0.5, 0.1), f7(0.4, 0.08), f7(0.6, 0.12)]) == "holds"
    assert _verdict("fig-dlion-7", [f7(0.5, 0.002)] * 3) == "tie"  # +0.2% over Ako is no effect
    assert _verdict("fig-dlion-7", [f7(0.5, -0.1)] * 3) == "does not hold"


def test_rejudge_judges_a_figures_numbers_again_and_keeps_the_verdict_it_had():
    from testbed.reproduce import rejudge

    seeds = {"1": {"falling_side": 1.3, "rising_side": 2.0}, "2": {"falling_side": 0.9, "rising_side": 1.8}}
    old = {"experiment": "fig-adsp-3", "scale": "ci", "seeds": [1, 2], "per_seed": seeds, "verdict": "holds",
           "criteria": [{"rule": "time to the target, fewest commits / the fastest intermediate rate: old rule",
                         "key": "falling_side", "verdict": "holds"}],
           "lines": ["| table |", "time to the target, fewest commits / the fastest intermediate rate: old rule",
                     "  -> holds: ...", "verdict: holds", "a note after"]}
    new = rejudge(old)
    assert new["verdict"] == "weak" and new["rejudged"]["verdict_before"] == "holds"  # seed 2 fell the wrong way
    assert new["rejudged"]["criteria_before"] == {"falling_side": "holds"}
    assert new["lines"][0] == "| table |" and new["lines"][-2:] == ["verdict: weak", "a note after"]
    assert sum(line.startswith("time to the target") for line in new["lines"]) == 2  # both criteria, once each
    assert rejudge(new) is new  # judged by today's criteria already: left as it is
