"""Link bandwidths: NVLink and InfiniBand from data/hardware.json (datasheet, per direction) and the published measured
ones of data/comm_measured.json, side by side (`derating_table`); the H800's cut NVLink against the H100's."""
from __future__ import annotations

from common.parallel.collectives.cost_model import ring_allreduce_time


def nvlink_bandwidth(gpu_id: str) -> float:
    """Bytes/s one GPU can send over NVLink in one direction: half the datasheet's bidirectional figure."""
    from common.facts import hardware
    return hardware.gpu(gpu_id).nvlink_gbs / 2 * 1e9


def ib_bandwidth(link_id: str = "ib-ndr") -> float:
    """Bytes/s of one InfiniBand port (one NIC per GPU) in one direction."""
    from common.facts import hardware
    return hardware.interconnect(link_id).gbs_per_direction * 1e9


def nvlink_allreduce_time(gpu_id: str, n_bytes: float, p: int = 8, alpha: float = 0.0) -> float:
    """Ring all-reduce of n bytes over p GPUs of one NVSwitch node of `gpu_id`s (alpha-beta model)."""
    return ring_allreduce_time(n_bytes, p, alpha, nvlink_bandwidth(gpu_id))


def h800_vs_h100_allreduce_ratio(n_bytes: float = 2**30, p: int = 8, alpha: float = 0.0) -> float:
    """Time on H800 NVLink (400 GB/s) over time on H100 NVLink (900 GB/s): ring all-reduce, alpha-beta model."""
    return nvlink_allreduce_time("H800-SXM", n_bytes, p, alpha) / nvlink_allreduce_time("H100-SXM", n_bytes, p, alpha)


def measured_comm() -> dict:
    """Published measured bandwidths from data/comm_measured.json: {key: entry}; each entry carries `value` (or
    `value_low`/`value_high`), unit, gpu, link, conditions and `source_title`."""
    import json

    from common.core.env import REPO_ROOT
    data = json.loads((REPO_ROOT / "data" / "comm_measured.json").read_text())
    out = {}
    for key, entry in data["measurements"].items():
        e = dict(entry)
        e["source_title"] = data["sources"][e["source"]]["title"]
        e["source_date"] = data["sources"][e["source"]]["date"]
        if "value" not in e:
            e["value"] = e["value_low"]
        out[key] = e
    return out


def derating_table() -> list:
    """Datasheet (per direction) beside published measured bandwidth: rows {measurement, link, datasheet_GBps,
    measured_GBps, measured_over_datasheet, conditions}."""
    rows = []
    for key, e in measured_comm().items():
        if e["link"] == "nvlink":
            sheet = nvlink_bandwidth(e["gpu"]) / 1e9
        else:
            sheet = ib_bandwidth() / 1e9
        shown = (f"{e['value_low']:g}-{e['value_high']:g}" if "value_high" in e else f"{e['value']:g}")
        rows.append({"measurement": key, "link": e["link"], "datasheet_GBps": sheet, "measured_GBps": shown,
                     "measured_over_datasheet": e["value"] / sheet, "conditions": e["conditions"]})
    return rows
