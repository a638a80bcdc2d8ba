"""The hardware facts table and its API (common/facts/hardware.py, data/hardware.json)."""
import json
import math

import pytest

from common.facts import hardware as hw

IDS = ["A100-SXM", "H100-SXM", "H800-SXM", "H200-SXM", "B200", "GB200"]


def test_ids_and_order():
    assert hw.gpu_ids() == IDS
    assert set(hw.interconnect_ids()) >= {"nvlink3", "nvlink4", "nvlink5", "ib-hdr", "ib-ndr", "ib-xdr", "pcie5-x16"}


@pytest.mark.parametrize("gid", IDS)
def test_every_gpu_has_complete_positive_facts(gid):
    g = hw.gpu(gid)
    for f in ("sms", "hbm_gb", "hbm_bandwidth_tbs", "l2_mb", "nvlink_gbs", "nvlink_generation", "tdp_w"):
        v = getattr(g, f)
        assert isinstance(v, (int, float)) and v > 0, (gid, f, v)
    assert g.id == gid and g.name
    for d, rate in g.tflops.items():
        assert d in hw.DTYPES
        assert set(rate) == {"dense", "sparse"}
        assert rate["dense"] > 0
        if rate["sparse"] is not None:  # NVIDIA's 2:4 sparse rate is exactly twice the dense one
            assert rate["sparse"] == pytest.approx(2 * rate["dense"], rel=1e-9)
    assert g.tflops["fp64"]["sparse"] is None


def test_headline_numbers():
    assert hw.peak_tflops("H100-SXM", "bf16") == pytest.approx(989.5)
    assert hw.peak_tflops("H100-SXM", "bf16", sparse=True) == pytest.approx(1979)
    assert hw.peak_tflops("H100-SXM", "fp64") == 67  # tensor-core FP64, not the 34 vector rate
    assert hw.peak_tflops("A100-SXM", "bf16") == 312
    assert hw.gpu("A100-SXM").hbm_bandwidth_tbs == pytest.approx(2.039)
    assert hw.gpu("H200-SXM").hbm_gb == 141 and hw.gpu("H200-SXM").hbm_bandwidth_tbs == 4.8
    assert hw.peak_tflops("B200", "fp4", sparse=True) == 18e3
    assert hw.gpu("B200").nvlink_gbs == 1800 and hw.gpu("B200").nvlink_generation == 5


def test_h800_differs_from_h100_only_in_nvlink_and_fp64():
    h100, h800 = hw.gpu("H100-SXM"), hw.gpu("H800-SXM")
    assert (h800.nvlink_gbs, h100.nvlink_gbs) == (400, 900)
    assert hw.peak_tflops("H800-SXM", "fp64") == pytest.approx(1) and hw.peak_tflops("H100-SXM", "fp64") == 67
    for d in ("tf32", "bf16", "fp8"):
        assert hw.peak_tflops("H800-SXM", d) == hw.peak_tflops("H100-SXM", d)
        assert hw.ridge_point("H800-SXM", d) == hw.ridge_point("H100-SXM", d)
    assert h800.hbm_bandwidth_tbs == h100.hbm_bandwidth_tbs and h800.hbm_gb == h100.hbm_gb
    assert h800.differs_from["gpu"] == "H100-SXM"
    assert set(h800.differs_from["fields"]) == {"nvlink_gbs", "tflops.fp64.dense"}


def test_gb200_per_gpu_is_rack_over_72():
    g = hw.gpu("GB200")
    rack = g.system
    assert rack["gpus"] == 72
    assert rack["pflops_sparse"]["fp4"] == 1440 and rack["pflops_dense"]["fp4"] == 720
    for d in ("fp4", "fp8", "bf16", "tf32"):
        assert g.tflops[d]["sparse"] * 72 / 1e3 == pytest.approx(rack["pflops_sparse"][d])
        assert g.tflops[d]["dense"] * 72 / 1e3 == pytest.approx(rack["pflops_dense"][d])
    assert g.nvlink_gbs * 72 / 1e3 == pytest.approx(rack["nvlink_tbs"], rel=0.01)  # 129.6 ~ "130 TB/s"
    assert g.hbm_bandwidth_tbs * 72 == pytest.approx(rack["hbm_bandwidth_tbs"])
    assert g.hbm_gb * 72 / 1e3 == pytest.approx(rack["hbm_tb"], rel=0.01)


def test_supported_dtypes():
    assert hw.supported_dtypes("A100-SXM") == ["fp64", "tf32", "bf16"]
    assert hw.supported_dtypes("H100-SXM") == ["fp64", "tf32", "bf16", "fp8"]
    assert hw.supported_dtypes("GB200") == ["fp64", "tf32", "bf16", "fp8", "fp4"]


@pytest.mark.parametrize("gid,dtype", [("H100-SXM", "fp4"), ("A100-SXM", "fp8"), ("A100-SXM", "fp4")])
def test_unsupported_dtype_raises_never_zero(gid, dtype):
    with pytest.raises(hw.UnsupportedDtype, match=rf"{gid} has no {dtype}.*supported on: .*B200"):
        hw.peak_tflops(gid, dtype)
    with pytest.raises(hw.UnsupportedDtype):
        hw.ridge_point(gid, dtype)
    assert issubclass(hw.UnsupportedDtype, ValueError)


def test_fp64_has_no_sparse_rate():
    with pytest.raises(hw.UnsupportedDtype, match="sparse"):
        hw.peak_tflops("H100-SXM", "fp64", sparse=True)


def test_bad_dtype_names_allowed():
    with pytest.raises(ValueError, match=r"dtype='int8'.*allowed: fp64, tf32, bf16, fp8, fp4"):
        hw.peak_tflops("H100-SXM", "int8")
    assert hw.peak_tflops("H100-SXM", "fp16") == hw.peak_tflops("H100-SXM", "bf16")
    assert hw.peak_tflops("H100-SXM", "torch.bfloat16") == hw.peak_tflops("H100-SXM", "bf16")


@pytest.mark.parametrize("bad,closest", [("H100", "H100-SXM"), ("B300", "B200"), ("h20-sxm", "H200-SXM"),
                                         ("A100-PCIe", "A100-SXM")])
def test_unknown_gpu_lists_known_ids_and_closest(bad, closest):
    with pytest.raises(hw.UnknownHardware) as info:
        hw.gpu(bad)
    msg = str(info.value)
    assert all(i in msg for i in IDS)
    assert f"closest match: {closest!r}" in msg
    assert isinstance(info.value, ValueError)


def test_ids_forgive_case():
    assert hw.gpu("h100-sxm").id == "H100-SXM"
    assert hw.interconnect("NVLink4").id == "nvlink4"


def test_unknown_interconnect():
    with pytest.raises(hw.UnknownHardware, match="closest match: 'nvlink5'"):
        hw.interconnect("nvlink6")


def test_ridge_point_is_peak_over_bandwidth():
    for gid in IDS:
        g = hw.gpu(gid)
        for d in hw.supported_dtypes(gid):
            assert hw.ridge_point(gid, d) == pytest.approx(g.tflops[d]["dense"] / g.hbm_bandwidth_tbs)
            assert math.isfinite(hw.ridge_point(gid, d))
    assert hw.ridge_point("H100-SXM", "bf16") == pytest.approx(295.37, abs=0.01)
    assert hw.ridge_point("H100-SXM", "bf16", sparse=True) == pytest.approx(2 * 295.37, abs=0.02)


def test_interconnects():
    assert hw.interconnect("nvlink3").gbs_bidirectional == 600 and hw.interconnect("nvlink3").links_per_gpu == 12
    assert hw.interconnect("nvlink4").gbs_bidirectional == 900 and hw.interconnect("nvlink4").links_per_gpu == 18
    assert hw.interconnect("nvlink5").gbs_bidirectional == 1800
    for lid, gbps in (("ib-hdr", 200), ("ib-ndr", 400), ("ib-xdr", 800)):
        link = hw.interconnect(lid)
        assert link.gbps_per_direction == gbps and link.gbs_per_direction == gbps / 8
        assert link.kind == "infiniband" and link.scope == "per port"
    for lid in hw.interconnect_ids():
        link = hw.interconnect(lid)
        assert link.gbs_bidirectional == pytest.approx(2 * link.gbs_per_direction)
        assert link.gbps_per_direction == pytest.approx(8 * link.gbs_per_direction)
    assert hw.nvlink("H800-SXM").generation == 4


@pytest.mark.parametrize("gid", IDS)
def test_every_number_has_a_source(gid):
    raw = json.loads(hw.DATA_FILE.read_text())["gpus"][gid]
    fields = [k for k in raw if k not in ("sources", "notes", "name")] + [f"tflops.{d}" for d in raw["tflops"]]
    for f in fields:
        s = hw.source(gid, f)
        assert s["title"] and s["url"].startswith("https://") and s["date"], (gid, f)


def test_sources_for_links_and_notes():
    for lid in hw.interconnect_ids():
        assert hw.source(lid)["url"].startswith("https://")
    assert "inferred" in hw.source("H800-SXM", "nvlink_links")["note"]
    assert "Chips and Cheese" in hw.source("B200", "sms")["note"]
    with pytest.raises(ValueError, match="field='flops'"):
        hw.source("H100-SXM", "flops")
    with pytest.raises(hw.UnsupportedDtype):
        hw.source("H100-SXM", "tflops.fp4")


def test_every_source_block_is_complete():
    data = json.loads(hw.DATA_FILE.read_text())
    for key, s in data["sources"].items():
        assert {"title", "url", "date", "accessed"} <= set(s), key
    used = {v for g in data["gpus"].values() for v in g["sources"].values()}
    used |= {link["source"] for link in data["interconnects"].values()}
    assert used <= set(data["sources"])


def test_returned_facts_cannot_corrupt_the_table():
    g = hw.gpu("H100-SXM")
    g.tflops["bf16"]["dense"] = 0
    assert hw.peak_tflops("H100-SXM", "bf16") == pytest.approx(989.5)


def test_table_rows():
    rows = hw.table("fp8")
    assert [r["gpu"] for r in rows] == IDS
    assert rows[0]["fp8_dense_tflops"] is None and rows[0]["ridge_flops_per_byte"] is None
    assert rows[1]["ridge_flops_per_byte"] == pytest.approx(1979 / 3.35)
