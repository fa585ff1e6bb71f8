"""The HTML report (numcheck.report.html): sections present exactly when their data is, no
external resource, escaping, heatmap values, error histograms and repro lines; and the error
histogram failing records carry (numcheck.measure.elements.ulp_histogram, Record.ulp_hist). The telemetry
page (telemetry_html): its heatmap cells are the frame's values, escaped, self-contained."""
from __future__ import annotations

import math
from html.parser import HTMLParser

import pytest
import torch

from numcheck.goldens import store as golden
from numcheck.measure.errorstats import ErrorStats
from numcheck.records import Golden, Record, Status
from numcheck.report.html import FULL_FAILURES, REASON_CHARS, html_report
from numcheck.telemetry.telemetry_html import MAX_STEPS, telemetry_html
from numcheck.measure.elements import ulp_histogram
from numcheck.verification import verify

EVIL = "<script>alert(1)</script>"
REPRO = "numcheck verify --op rms_norm --kernel 'pkg.k:f<T>&x' --adhoc '{\"seed\":0}'"
PROV = {"device_class": "cpu", "device_name": "AMD EPYC", "numcheck": "0.1.0",
        "torch": "2.13.0+cpu", "cpu_isa": "AVX512-BF16", "date": "2026-01-01",
        "golden_mode": "check"}
SECTIONS = ["summary", "failures", "worst", "quant", "convergence", "fingerprints", "telemetry"]


def stats(sqnr=60.0, **kw) -> ErrorStats:
    base = dict(fmt="bf16", n=512, n_compared=512, n_nan=0, n_inf=0, nonfinite_mismatch=0,
                max_abs=0.5, mean_abs=0.1, rel_l2=10 ** (-sqnr / 20), sqnr_db=sqnr, cosine=1.0,
                bias=0.0, max_ulp=1, mean_ulp=0.5, p99_ulp=1, bias_ulp=0.0, mag_bias_ulp=0.0,
                min_block_sqnr_db=sqnr - 3, worst_block=0, n_blocks=4)
    return ErrorStats(**{**base, **kw})


def op_record(kernel="torch", case="bf16-4x128-normal-s0", status=Status.PASSED, sqnr=50.0,
              **kw) -> Record:
    kw = {"golden": Golden.SAME, **kw}
    return Record(suite="ops", op="rms_norm", kernel=kernel, case_id=case, status=status,
                  kernel_stats=stats(sqnr), baseline_stats=stats(sqnr + 1),
                  repro=f"numcheck verify --op rms_norm --kernel {kernel}", **kw)


def quant_records() -> list[Record]:
    out = []
    for i, path in enumerate(("fp8_e4m3_row", "mx_e2m1_floor", 'nv"fp4')):
        for j, dist in enumerate(("normal", "student_t")):
            status = Status.FAILED if (i, j) == (1, 1) else Status.PASSED
            out.append(Record(suite="quant", family="quant", op="roundtrip", kernel=path,
                              case_id=f"fp32-64x256-{dist}-s1", dist=dist, status=status,
                              kernel_stats=stats(31.25 - 6.5 * i + 0.125 * j, fmt="fp32"),
                              baseline_stats=stats(55.5, fmt="fp32")))
    out.append(Record(suite="quant", family="quant", op="gemm", kernel="mxfp8", dist="normal",
                      case_id="fp32-64x512x64-normal-s2", status=Status.PASSED,
                      kernel_stats=stats(27.5, fmt="fp32"), baseline_stats=stats(52.6)))
    return out


def convergence_records() -> list[Record]:
    out = []
    for recipe, series in (("fp32", [0.0] * 6), ("bf16", [0.0, 1e-3, 2e-3, 1e-3, 0.0, 5e-4]),
                           ("nvfp4", [0.0, 0.01, math.nan, 0.03, 0.02, 0.02])):
        out.append(Record(suite="convergence", family="convergence", op="mlp", kernel=recipe,
                          case_id=f"mlp-{recipe}-s6-k3", output="loss", status=Status.PASSED,
                          series=series, series_band=[0.0 if recipe == "fp32" else 1e-3] * 6))
    return out


def fingerprint_records() -> list[Record]:
    props = {"acc_bits": 23.0, "promote_every": 0.0, "acc_rounding": "rne", "order": "pairwise",
             "deterministic": True, "batch_invariant": False}
    return [Record(suite="fingerprint", family="fingerprint", op="matmul", kernel="torch",
                   case_id="bf16", output="fingerprint", dtype="bf16", device_class=dev,
                   status=Status.PASSED, metrics=props) for dev in ("cpu", "cuda-sm90")]


def telemetry_records() -> list[Record]:
    """Two layers of one (model, recipe), as numcheck.telemetry.floors makes them; the second
    regressed against its golden."""
    def rec(layer, sqnr, under, **kw):
        return Record(suite="telemetry", family="telemetry", op="telemetry", kernel="linear",
                      case_id=f"tiny/mxfp8/{layer}", output="telemetry", status=Status.PASSED,
                      params="pass=forward,recipe=mxfp8,what_if=False",
                      metrics={"sqnr_db_floor": sqnr, "underflow_pct_ceiling": under,
                               "steps": 4, "n": 4096.0}, **kw)
    return [rec("fc1/input", 31.25, 0.0),
            rec("fc2/<w>", 22.5, 1.5, golden=Golden.REGRESSED,
                golden_reason="SQNR floor golden 30.87 dB, now 22.5 dB")]


def sample() -> list[Record]:
    """Records of every section: passing and failing ops (a histogram, an escaped kernel name
    and repro line, an error, a golden regression), quant, convergence, fingerprints,
    telemetry."""
    failing = op_record(kernel=EVIL, case="fp32-4x128-normal-s0", status=Status.FAILED, sqnr=20.0,
                        reason="rel_l2 > 2 x baseline <b>&", ulp_hist=[3, 0, 5, 500],
                        worst_elements="[0, 1]: out=1 ref=2 err=1")
    failing.repro = REPRO
    failing.kernel_stats = stats(20.0, n_compared=508, nonfinite_mismatch=4)
    return [op_record(), op_record(kernel="fused", sqnr=45.0), failing,
            op_record(kernel="err", status=Status.ERROR, reason="kernel err raised ValueError",
                      traceback="Traceback ...\nValueError: x < 0").replace(
                kernel_stats=None, baseline_stats=None),
            op_record(kernel="slower", golden=Golden.REGRESSED, golden_reason="SQNR -0.5 dB"),
            *quant_records(), *convergence_records(), *fingerprint_records(),
            *telemetry_records()]


class Node:
    def __init__(self, tag: str, attrs: dict, parent: "Node | None"):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.content: list = []  # text and child nodes, in document order

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.content)

    def find(self, tag: str | None = None, **attrs) -> list["Node"]:
        """Descendants with this tag whose attributes hold these words (class_ for class)."""
        hits = []
        for c in self.content:
            if isinstance(c, str):
                continue
            if (tag is None or c.tag == tag) and all(
                    v in c.attrs.get(k.rstrip("_"), "").split() for k, v in attrs.items()):
                hits.append(c)
            hits += c.find(tag, **attrs)
        return hits


VOID = {"meta", "br", "hr", "img", "input", "link"}


class Tree(HTMLParser):
    """A minimal DOM; fails on a closing tag that does not match the open element."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.root = self.node = Node("#root", {}, None)
        self.feed(page)
        self.close()
        assert self.node is self.root, f"unclosed <{self.node.tag}>"

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.node)
        self.node.content.append(node)
        if tag not in VOID:
            self.node = node

    def handle_startendtag(self, tag, attrs):
        self.node.content.append(Node(tag, dict(attrs), self.node))

    def handle_endtag(self, tag):
        assert tag == self.node.tag, f"</{tag}> closes <{self.node.tag}>"
        self.node = self.node.parent

    def handle_data(self, data):
        self.node.content.append(data)


def sections(tree: Tree) -> dict[str, Node]:
    return {s.attrs["id"]: s for s in tree.root.find("section")}


def test_every_section_with_its_data():
    tree = Tree(html_report(sample(), PROV))
    assert list(sections(tree)) == SECTIONS
    assert [a.attrs["href"] for a in tree.root.find("nav")[0].find("a")] == \
        [f"#{s}" for s in SECTIONS]
    assert tree.root.find("title")[0].text() == "numcheck report: cpu 2026-01-01"


WITHOUT = {  # section -> the sample without that section's data
    "worst": lambda rs: [r.replace(baseline_stats=None) for r in rs],
    "quant": lambda rs: [r for r in rs if r.family != "quant"],
    "convergence": lambda rs: [r for r in rs if r.series is None],
    "fingerprints": lambda rs: [r for r in rs if r.family != "fingerprint"],
    "telemetry": lambda rs: [r for r in rs if r.suite != "telemetry"],
}


@pytest.mark.parametrize("section", WITHOUT)
def test_a_section_without_data_is_left_out(section):
    got = list(sections(Tree(html_report(WITHOUT[section](sample()), PROV))))
    assert got == [s for s in SECTIONS if s != section]


def test_empty_record_list_gives_a_valid_page():
    tree = Tree(html_report([], {}))
    found = sections(tree)
    assert list(found) == ["summary", "failures"]
    assert "None: no failures" in found["failures"].text()
    assert tree.root.find("title")[0].text() == "numcheck report: ?"


def test_no_external_resource():
    page = html_report(sample(), PROV)
    assert "http://" not in page and "https://" not in page and "url(" not in page
    tree = Tree(page)
    assert not tree.root.find("script") and not tree.root.find("link") and \
        not tree.root.find("img") and not tree.root.find("iframe")
    nodes = tree.root.find()
    assert not [n for n in nodes if "src" in n.attrs]
    assert all(n.attrs["href"].startswith("#") for n in nodes if "href" in n.attrs)


def test_strings_from_records_are_escaped():
    page = html_report(sample(), PROV)
    assert EVIL not in page and "<b>&" not in page
    tree = Tree(page)
    assert not tree.root.find("script")
    failures = sections(tree)["failures"]
    assert f"rms_norm/{EVIL} fp32-4x128-normal-s0 out failed" in \
        [h.text() for h in failures.find("h3")]
    assert "rel_l2 > 2 x baseline <b>&" in failures.text()
    quant_rows = [tr.find("th")[0].text() for tr in sections(tree)["quant"].find("tr")]
    assert 'nv"fp4' in quant_rows


def test_heatmap_cells_are_the_records_sqnr():
    tree = Tree(html_report(sample(), PROV))
    tables = {t.attrs["data-op"]: t for t in sections(tree)["quant"].find("table")}
    checked = 0
    for r in quant_records():
        table = tables[r.op]
        dists = [th.text() for th in table.find("thead")[0].find("th")[1:]]
        row = next(tr for tr in table.find("tbody")[0].find("tr")
                   if tr.find("th")[0].text() == r.kernel)
        cell = row.find("td")[dists.index(r.dist)]
        assert float(cell.attrs["data-db"]) == r.kernel_stats.sqnr_db
        want = f"{r.kernel_stats.sqnr_db:.1f}" + (" FAIL" if r.status == Status.FAILED else "")
        assert cell.text() == want
        checked += 1
    assert checked == len(quant_records())


def qdq(params, status=Status.PASSED, sqnr=40.0, dist="normal", **kw) -> Record:
    """A quant-family record of an op whose one kernel, torch, runs every format."""
    return Record(suite="quant", family="quant", op="fp8_qdq", kernel="torch", params=params,
                  case_id=f"fp32-64x256-{dist}-{params}", dist=dist, status=status,
                  kernel_stats=stats(sqnr, fmt="fp32"), baseline_stats=stats(sqnr + 20), **kw)


def test_a_heatmap_cell_is_the_worst_of_its_records():
    """Rows are quantization paths (kernel + format params, not the axis); a cell shows the
    lowest SQNR of its records and FAIL where any of them fails the run, whatever comes last."""
    records = [qdq("fmt=e4m3,granularity=row,dim=-1", Status.FAILED, 10.0),
               qdq("fmt=e4m3,granularity=row,dim=0", Status.PASSED, 35.0),
               qdq("fmt=e5m2,granularity=row,dim=-1", Status.PASSED, 40.0),
               qdq("fmt=e5m2,granularity=row,dim=-1", dist="student_t", sqnr=41.0,
                   golden=Golden.REGRESSED),
               Record(suite="quant", family="quant", op="roundtrip", kernel="fp8_e4m3_row",
                      params="path=fp8_e4m3_row", dist="normal", status=Status.PASSED,
                      kernel_stats=stats(31.5, fmt="fp32"), baseline_stats=stats(55.0))]
    quant = sections(Tree(html_report(records, PROV)))["quant"]
    cells = {}
    for table in quant.find("table"):
        dists = [th.text() for th in table.find("thead")[0].find("th")[1:]]
        for tr in table.find("tbody")[0].find("tr"):
            for d, td in zip(dists, tr.find("td")):
                cells[table.attrs["data-op"], tr.find("th")[0].text(), d] = td
    e4m3 = cells["fp8_qdq", "torch fmt=e4m3,granularity=row", "normal"]
    assert e4m3.text() == "10.0 FAIL" and "fail" in e4m3.attrs["class"].split()
    assert e4m3.attrs["data-records"] == "2" and "2 record(s), 1 failing" in e4m3.attrs["title"]
    assert cells["fp8_qdq", "torch fmt=e5m2,granularity=row", "normal"].text() == "40.0"
    assert cells["fp8_qdq", "torch fmt=e5m2,granularity=row", "student_t"].text() == \
        "41.0 FAIL"  # passed its rules, regressed on its golden: fails the run
    assert cells["fp8_qdq", "baseline", "normal"].text() == "30.0"  # the lowest yardstick
    assert cells["roundtrip", "fp8_e4m3_row", "normal"].text() == "31.5"


def test_missing_or_nan_statistics_show_a_dash():
    """Stats fields a producer or an older results file leaves empty (None) or NaN: shown as a
    dash everywhere, the page still built."""
    empty = dict(sqnr_db=None, min_block_sqnr_db=None, max_ulp=None, p99_ulp=None,
                 n_compared=None, nonfinite_mismatch=None)
    nan = dict(sqnr_db=math.nan, min_block_sqnr_db=math.nan, max_ulp=math.nan)
    op_none = op_record(kernel="none", status=Status.FAILED, ulp_hist=[4, 1])
    op_none.kernel_stats, op_none.baseline_stats = stats(**empty, rel_l2=None), None
    op_nan = op_record(kernel="nan")
    op_nan.kernel_stats, op_nan.baseline_stats = stats(**nan), stats(**nan)
    rt = [Record(suite="quant", family="quant", op="roundtrip", kernel=k, dist="normal",
                 status=Status.PASSED, kernel_stats=stats(**kw), baseline_stats=b)
          for k, kw, b in (("none", empty, None), ("nan", nan, stats(**nan)))]
    found = sections(Tree(html_report([op_none, op_nan, *rt], PROV)))
    assert "SQNR \u2014 dB (baseline \u2014 dB), worst block \u2014 dB, max \u2014 ULP" in \
        found["failures"].text()
    assert [td.text() for td in found["quant"].find("td")] == ["\u2014"] * 3  # 2 rows, bf16
    worst = [td.text() for td in found["worst"].find("td")]
    assert worst[5:9] == ["\u2014"] * 4  # rms_norm/nan; rms_norm/none has no rel_l2 to rank


def test_failures_past_the_cap_are_one_row_each():
    """A first strict run on a new device class: every record fails. The first FULL_FAILURES
    in full, one table row for each of the others, and the total said."""
    records = [op_record(kernel=f"k{i:03}", status=Status.FAILED, reason=f"{i} " + "x" * 300)
               if i % 2 else op_record(kernel=f"k{i:03}", golden=Golden.MISSING)
               for i in range(500)]
    failures = sections(Tree(html_report(records, {**PROV, "golden_mode": "strict"})))["failures"]
    assert len(failures.find("article")) == FULL_FAILURES == 200
    rows = failures.find("table")[0].find("tbody")[0].find("tr")
    assert len(rows) == 300
    assert "500 failing records: the first 200 in full, the other 300" in failures.text()
    first = [td.text() for td in rows[0].find("td")]
    assert first[:3] == ["rms_norm/k200 bf16-4x128-normal-s0 out", "passed", "missing"]
    reason = [td.text() for td in rows[1].find("td")][3]
    assert reason.startswith("201 xxx") and len(reason) == REASON_CHARS and reason[-1] == "\u2026"


def test_ulp_histogram_counts_a_known_tensor():
    """bf16 values k ULPs above 1.0 (2^-7 apart) against the reference 1.0, plus a NaN and an
    inf the reference does not have: counts per bucket as counted by hand."""
    offsets = [0, 0, 1, 2, 3, 4, 7, 8, 100, 127]
    out = torch.tensor([1 + k * 2.0 ** -7 for k in offsets] + [math.nan, math.inf],
                       dtype=torch.bfloat16)
    ref = torch.ones(len(offsets) + 2, dtype=torch.float64)
    want = [0] * 8  # bucket 0: exact; bucket k: [2^(k-1), 2^k)
    for k in offsets:
        want[k.bit_length()] += 1
    assert ulp_histogram(out, ref, "bf16") == want == [2, 1, 2, 2, 1, 0, 0, 2]


def bars(node: Node) -> list[int]:
    return [int(rect.attrs["data-count"]) for rect in node.find("rect")]


def test_every_failing_case_shows_its_histogram_or_why_not():
    tree = Tree(html_report(sample(), PROV))
    cases = {a.find("h3")[0].text().split(" ")[0]: a
             for a in sections(tree)["failures"].find("article")}
    assert set(cases) == {f"rms_norm/{EVIL}", "rms_norm/err", "rms_norm/slower",
                          "roundtrip/mx_e2m1_floor", "telemetry/linear"}
    assert "per-layer statistics, not element errors" in cases["telemetry/linear"].text()
    assert bars(cases[f"rms_norm/{EVIL}"].find("svg")[0]) == [3, 0, 5, 500, 4]  # + mismatches
    assert "no output to measure" in cases["rms_norm/err"].text()
    assert "passed its rules and fails on its golden (regressed); rerun its repro to see the " \
        "errors" in cases["rms_norm/slower"].text()
    assert "none recorded" in cases["roundtrip/mx_e2m1_floor"].text()
    assert not cases["rms_norm/err"].find("svg")


def test_failing_records_show_their_repro_command():
    failures = sections(Tree(html_report(sample(), PROV)))["failures"]
    repros = [p.text() for p in failures.find("pre", class_="repro")]
    assert REPRO in repros and "numcheck verify --op rms_norm --kernel slower" in repros
    assert "numcheck verify --op rms_norm --kernel fused" not in failures.text()


@pytest.mark.parametrize("mode, fails", [("check", False), ("strict", True)])
def test_failures_follow_the_results_golden_mode(mode, fails):
    r = op_record(kernel="moved", golden=Golden.INPUTS_CHANGED)
    failures = sections(Tree(html_report([r], {**PROV, "golden_mode": mode})))["failures"]
    assert ("rms_norm/moved" in failures.text()) is fails


def test_convergence_curves_one_line_per_recipe():
    svg = sections(Tree(html_report(convergence_records(), PROV)))["convergence"].find("svg")
    assert len(svg) == 1
    lines = [p.find("title")[0].text() for p in svg[0].find("polyline")]
    assert lines == ["bf16", "fp32", "nvfp4", "nvfp4"]  # the NaN step breaks nvfp4's line
    assert len(svg[0].find("polygon")) == 3  # bands where the seeds spread (fp32 has none)


def test_fingerprint_table_per_device():
    fp = sections(Tree(html_report(fingerprint_records(), PROV)))["fingerprints"]
    assert [h.text() for h in fp.find("h3")] == ["cpu", "cuda-sm90"]
    row = [td.text() for td in fp.find("tbody")[0].find("td")]
    assert row == ["matmul", "torch", "bf16", "23", "0", "rne", "pairwise", "True", "False"]


def test_telemetry_heatmap_per_model_and_recipe():
    tm = sections(Tree(html_report(telemetry_records(), PROV)))["telemetry"]  # strict
    assert [h.text() for h in tm.find("h3")] == ["tiny: mxfp8"]
    heat = tm.find("table", class_="heatmap")[0]
    assert [th.text() for th in heat.find("thead")[0].find("th")] == \
        ["layer (op)", "SQNR floor (dB)", "underflow ceiling (%)"]
    rows = heat.find("tbody")[0].find("tr")
    assert [r.attrs["data-case"] for r in rows] == ["tiny/mxfp8/fc1/input", "tiny/mxfp8/fc2/<w>"]
    good, bad = ([td for td in r.find("td")] for r in rows)
    assert [td.text() for td in good] == ["31.25", "0"]
    assert [td.text() for td in bad] == ["22.5 FAIL", "1.5 FAIL"]
    assert all("fail" in td.attrs["class"].split() for td in bad)
    assert "golden 30.87 dB" in bad[0].attrs["title"]
    # colours per column: the better SQNR green (hue 120), the worse red (hue 0); lower
    # underflow is better
    assert "hsl(120," in good[0].attrs["style"] and "hsl(0," in bad[0].attrs["style"]
    assert "hsl(120," in good[1].attrs["style"] and "hsl(0," in bad[1].attrs["style"]
    folded = tm.find("details")[0]
    assert "All 2 telemetry records" in folded.find("summary")[0].text()
    assert len(folded.find("tbody")[0].find("tr")) == 2


CASE = "fp32-4x128-normal-s0-contiguous"


@pytest.fixture(scope="module")
def planted(one_thread) -> list[Record]:
    """silu scaled by 1.01: fails forward and backward on one fp32 case."""
    def scaled_silu(x):
        return (torch.nn.functional.silu(x.float()) * 1.01).to(x.dtype)
    return verify("silu", scaled_silu, device="cpu", case_ids=[CASE]).records


def test_a_failing_case_carries_its_histogram_through_results(planted, tmp_path):
    assert [r.status for r in planted] == [Status.FAILED, Status.FAILED]
    for r in planted:
        assert sum(r.ulp_hist) == r.kernel_stats.n_compared
        assert len(r.ulp_hist) - 1 == r.kernel_stats.max_ulp.bit_length()  # top bucket
    path = golden.write_results(tmp_path / "r.parquet", planted, PROV)
    back, _ = golden.read_results(path)
    assert sorted(r.ulp_hist for r in back) == sorted(r.ulp_hist for r in planted)
    assert "ulp_hist" in golden.RESULTS_SCHEMA.names and "ulp_hist" not in golden.COLUMNS
    failures = sections(Tree(html_report(back, PROV)))["failures"]
    assert sorted(bars(svg) for svg in failures.find("svg")) == \
        sorted(r.ulp_hist for r in planted)


def test_a_passing_case_carries_no_histogram(one_thread):
    r = verify("silu", lambda x: torch.nn.functional.silu(x), device="cpu",
               case_ids=[CASE]).records
    assert [x.status for x in r] == [Status.PASSED, Status.PASSED]
    assert all(x.ulp_hist is None for x in r)


# --- the telemetry page -------------------------------------------------------------------------

def assert_self_contained(page: str) -> Tree:
    assert "http://" not in page and "https://" not in page and "url(" not in page
    tree = Tree(page)
    nodes = tree.root.find()
    assert not [n for n in nodes if n.tag in ("script", "link", "img", "iframe") or "src" in n.attrs]
    assert all(n.attrs["href"].startswith("#") for n in nodes if "href" in n.attrs)
    return tree


def heatmaps(tree: Tree) -> dict[tuple[str, str], dict]:
    """(column, recipe) -> {(module, op, role): {step: td}}."""
    out = {}
    for table in tree.root.find("table", class_="heatmap"):
        grid = out[table.attrs["data-column"], table.attrs["data-recipe"]] = {}
        for tr in table.find("tbody")[0].find("tr"):
            key = tr.attrs["data-module"], tr.attrs["data-op"], tr.attrs["data-role"]
            grid[key] = {int(td.attrs["data-step"]): td for td in tr.find("td")}
    return out


@pytest.fixture(scope="module")
def watched(one_thread):
    from numcheck.telemetry import inspect as ins
    return ins.run("mlp", recipe="mxfp8", what_if=("nvfp4",), shadow=True, steps=2).records()


def test_telemetry_page_cells_are_the_frames_values(watched):
    page = telemetry_html(watched, producer="first non-finite producer: none")
    tree = assert_self_contained(page)
    assert list(sections(tree)) == ["summary", "recipe-0", "recipe-1", "shadow", "amax"]
    assert "first non-finite producer: none" in sections(tree)["summary"].text()
    maps = heatmaps(tree)
    assert set(maps) == {(c, r) for r in ("mxfp8", "nvfp4") for c in (
        "sqnr_db", "worst_block_sqnr_db", "underflow_pct", "saturation_pct")} | {
        ("shadow_sqnr_db", ""), ("e2e_sqnr_db", ""), ("amax", "")}
    checked = 0
    for (column, recipe), grid in maps.items():
        rows = watched[(watched["recipe"] == recipe) & (watched["what_if"] == (recipe == "nvfp4"))
                       & watched[column].notna()]
        if column in ("amax", "shadow_sqnr_db", "e2e_sqnr_db"):
            rows = watched[~watched["what_if"] & (watched["role"] == "output")]
        assert set(grid) == set(zip(rows["module"], rows["op"], rows["role"]))
        for r in rows.itertuples():
            td = grid[r.module, r.op, r.role][r.step]
            want = getattr(r, column)
            assert float(td.attrs["data-value"]) == want
            assert td.text() == (f"{want:.3g}" if column == "amax" else
                                 f"{want:.2f}" if column.endswith("pct") else f"{want:.1f}")
            checked += 1
    assert checked > 100
    # rows in model order, a module's rows together
    assert [k[:1] + k[2:] for k in maps["sqnr_db", "mxfp8"]] == [
        (m, role) for m in ("fc1", "fc2", "fc3") for role in ("input", "weight", "grad_output")]
    assert maps["amax", ""]["fc2", "linear", "output"][1].attrs["title"].startswith(
        "fc2 (linear, output), step 1: amax")


EVIL_MODULE = "blocks.0.<b>&amp;</b>"


def hand_frame():
    """Two ranks, a NaN SQNR, a step a row misses, an output with an Inf, no what-if rows."""
    import pandas as pd
    rows = []
    for rank in (0, 1):
        for step in (0, 1, 2):
            sq = math.nan if (step, rank) == (1, 0) else 20.0 + step + rank
            rows.append(dict(step=step, rank=rank, module=EVIL_MODULE, op="linear", role="input",
                             recipe="mxfp4", what_if=False, sqnr_db=sq, amax=1.0, nonfinite=0.0))
            if step != 2:
                rows.append(dict(step=step, rank=rank, module="<model>", op="module",
                                 role="output", recipe="", what_if=False, sqnr_db=math.nan,
                                 amax=10.0 ** step if step else -math.inf,
                                 nonfinite=float(step == 0)))
            rows.append(dict(step=step, rank=rank, module=EVIL_MODULE, op="linear",
                             role="output", recipe="", what_if=False, sqnr_db=math.nan,
                             amax=4.0 * (step + 1) + rank, nonfinite=0.0))
    return pd.DataFrame(rows)


def test_telemetry_page_escapes_merges_and_dashes():
    producer = "first non-finite producer: step 0, <model> (module), output & more"
    page = telemetry_html(hand_frame(), title="t <i>&", producer=producer)
    assert "<b>&amp;</b>" not in page and "<model>" not in page and "<i>&" not in page
    tree = assert_self_contained(page)
    assert tree.root.find("title")[0].text() == "t <i>&"
    found = sections(tree)
    assert list(found) == ["summary", "recipe-0", "amax"]  # no worst-block etc., no shadow
    assert producer in [p.text() for p in found["summary"].find("p", class_="producer")]
    assert "3 step(s) (0 to 2), 2 module(s), ranks 0, 1" in found["summary"].text()
    maps = heatmaps(tree)
    sqnr = maps["sqnr_db", "mxfp4"][EVIL_MODULE, "linear", "input"]
    assert [sqnr[s].text() for s in (0, 1, 2)] == ["20.0", "22.0", "22.0"]  # worst rank; NaN
    amax = maps["amax", ""]                                                  # only where all are
    assert list(amax) == [(EVIL_MODULE, "linear", "output"), ("<model>", "module", "output")]
    assert [amax[EVIL_MODULE, "linear", "output"][s].text() for s in (0, 1, 2)] == \
        ["5", "9", "13"]  # the largest rank's
    root = amax["<model>", "module", "output"]
    assert root[0].text() == "\u2014 NaN/Inf" and "fail" in root[0].attrs["class"].split()
    assert root[1].text() == "10" and root[2].text() == "\u2014"  # no finite element; no row
    assert found["recipe-0"].find("tbody")[0].find("th")[0].text() == \
        f"{EVIL_MODULE} (linear, input)"


def test_telemetry_page_of_an_empty_frame():
    from numcheck.telemetry.fields import frame
    found = sections(assert_self_contained(telemetry_html(frame([]))))
    assert list(found) == ["summary"] and "No records." in found["summary"].text()


def test_telemetry_page_of_a_long_run_shows_evenly_spaced_steps():
    import pandas as pd
    n = 3 * MAX_STEPS
    frame = pd.DataFrame(dict(step=range(n), rank=0, module="fc", op="linear", role="output",
                              recipe="", what_if=False, amax=[float(s) for s in range(n)],
                              nonfinite=0.0))
    tree = Tree(telemetry_html(frame))
    cells = heatmaps(tree)["amax", ""]["fc", "linear", "output"]
    assert len(cells) == MAX_STEPS and {0, n - 1} <= set(cells)
    assert f"show {MAX_STEPS} of the {n} steps" in sections(tree)["summary"].text()


def test_telemetry_heatmaps_leave_out_records_without_statistics():
    """A record of the telemetry suite that carries no statistic (a test that errored before
    its floors, a user's own record with a short case id) gets no heatmap of its own (an
    empty table under a made-up model and recipe); it stays in the folded table."""
    err = Record(suite="telemetry", op="test", kernel="", case_id="test_telemetry[tiny_lm]",
                 output="", status=Status.ERROR, reason="RuntimeError: <boom>")
    short = Record(suite="telemetry", family="telemetry", op="telemetry", kernel="linear",
                   case_id="mine", output="telemetry", status=Status.PASSED, metrics={"x": "y"})
    tm = sections(Tree(html_report([*telemetry_records(), err, short], PROV)))["telemetry"]
    assert [h.text() for h in tm.find("h3")] == ["tiny: mxfp8"]
    assert len(tm.find("table", class_="heatmap")) == 1
    assert "All 4 telemetry records" in tm.find("details")[0].find("summary")[0].text()


def test_results_report_has_the_telemetry_per_layer_step_heatmaps(watched, tmp_path):
    from numcheck.telemetry.floors import as_records
    recs = as_records(watched, model="mlp")
    path = golden.write_results(tmp_path / "r.parquet", recs, PROV)
    back, _ = golden.read_results(path)
    tm = sections(Tree(html_report(back, PROV)))["telemetry"]
    folded = [d for d in tm.find("details") if "Per step" in d.find("summary")[0].text()]
    assert len(folded) == len({r.case_id.split("/")[1] for r in recs})  # one per recipe
    maps: dict = {}
    for d in folded:
        for table in d.find("table", class_="heatmap"):
            for tr in table.find("tbody")[0].find("tr"):
                key = (table.attrs["data-recipe"], table.attrs["data-column"],
                       tr.attrs["data-module"], tr.attrs["data-role"])
                maps[key] = {int(td.attrs["data-step"]): td for td in tr.find("td")}
    # every cell is the frame's statistic of that (recipe, layer, role, step)
    observed = watched[~watched["what_if"]]
    checked = 0
    for (recipe, column, module, role), cells in maps.items():
        assert column != "nonfinite"  # all zero here: no table of zeros
        rows = watched[(watched["module"] == module) & (watched["role"] == role)]
        rows = rows[rows["recipe"] == recipe] if column in ("sqnr_db", "worst_block_sqnr_db",
                                                              "underflow_pct", "saturation_pct") \
            else observed[(observed["module"] == module) & (observed["role"] == role)]
        assert sorted(cells) == sorted(rows["step"].astype(int))
        for step, want in zip(rows["step"].astype(int), rows[column]):
            got = float(cells[step].attrs["data-value"])
            assert got == want or (math.isnan(got) and math.isnan(want))
            checked += 1
    assert checked > 60
    assert {k[1] for k in maps} == {"sqnr_db", "worst_block_sqnr_db", "underflow_pct",
                                    "saturation_pct", "shadow_sqnr_db", "e2e_sqnr_db"}


def test_results_report_per_step_keeps_nonfinite_steps_and_poison_and_skips_malformed():
    """Past MAX_STEPS columns the steps are sampled, but a step with a NaN or Inf is always
    drawn; two records of one layer merge to the worse value, a NaN to NaN, an undefined step
    (None) to the other's value; a malformed list (another length) is left out."""
    from numcheck.telemetry.telemetry_html import MAX_STEPS, shown_steps
    n = 3 * MAX_STEPS
    sampled = shown_steps(list(range(n)))
    bad_step = next(s for s in range(n) if s not in sampled)
    s1, s2 = sampled[1], sampled[2]

    def rec(layer, sqnr, nonfinite, device="cpu"):
        return Record(suite="telemetry", family="telemetry", op="telemetry", kernel="linear",
                      case_id=f"tiny/mxfp8/{layer}", output="telemetry", status=Status.PASSED,
                      device_class=device, metrics={"sqnr_db_floor": 1.0, "nonfinite_ceiling":
                                                    max(nonfinite)},
                      per_step={"step": list(range(n)), "sqnr_db_floor": sqnr,
                                "nonfinite_ceiling": nonfinite})
    sq = [30.0] * n
    nf = [0.0] * n
    nf[bad_step] = 2.0
    a = rec("fc1/input", [None] + sq[1:], nf)
    b_sq = list(sq)
    b_sq[0], b_sq[s1], b_sq[s2] = 31.0, 29.0, math.nan
    b = rec("fc1/input", b_sq, [0.0] * n, device="cuda-sm90")
    c = rec("fc2/input", sq[:-1], nf)   # one value short: malformed, left out
    tm = sections(Tree(html_report([a, b, c], PROV)))["telemetry"]
    tables = {t.attrs["data-column"]: t for d in tm.find("details")
              if "Per step" in d.find("summary")[0].text()
              for t in d.find("table", class_="heatmap")}
    assert set(tables) == {"sqnr_db", "nonfinite"}
    rows = {tr.attrs["data-module"]: {int(td.attrs["data-step"]): td for td in tr.find("td")}
            for tr in tables["sqnr_db"].find("tbody")[0].find("tr")}
    assert set(rows) == {"fc1"}
    cells = rows["fc1"]
    assert len(cells) < n and bad_step in cells
    assert "fail" in cells[bad_step].attrs["class"].split()
    assert float(cells[0].attrs["data-value"]) == 31.0       # undefined in a: b's value
    assert float(cells[s1].attrs["data-value"]) == 29.0      # the worse floor
    assert math.isnan(float(cells[s2].attrs["data-value"]))  # NaN poisons


def test_a_run_that_stays_non_finite_adds_one_column_not_one_per_step():
    """A run that diverges at a step and stays NaN: the onset is drawn, the later NaN steps
    are sampled like any other; a malformed per_step (an Infinity step, a huge value) is left
    out without breaking the page."""
    from numcheck.telemetry.telemetry_html import MAX_STEPS, shown_steps
    n = 20 * MAX_STEPS
    sampled = shown_steps(list(range(n)))
    onset = next(s for s in range(n // 2, n) if s not in sampled)
    nf = [0.0] * onset + [3.0] * (n - onset)
    rec = Record(suite="telemetry", family="telemetry", op="telemetry", kernel="linear",
                 case_id="tiny/mxfp8/fc1/input", output="telemetry", status=Status.PASSED,
                 metrics={"sqnr_db_floor": 1.0, "nonfinite_ceiling": 3.0},
                 per_step={"step": list(range(n)), "sqnr_db_floor": [30.0] * n,
                           "nonfinite_ceiling": nf})
    odd = rec.replace(case_id="tiny/mxfp8/fc2/input",
                      per_step={"step": [0, math.inf], "sqnr_db_floor": [1.0, 10 ** 400]})
    tm = sections(Tree(html_report([rec, odd], PROV)))["telemetry"]
    table = next(t for d in tm.find("details") if "Per step" in d.find("summary")[0].text()
                 for t in d.find("table", class_="heatmap"))
    cells = {int(td.attrs["data-step"]) for td in table.find("tbody")[0].find("td")}
    assert cells == set(sampled) | {onset} and len(cells) <= MAX_STEPS + 1
