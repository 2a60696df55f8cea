"""The text of the catalogues (``clusterplan models``, ``clusters``, ``devices``): one table row per
bundled entry, its id never broken on a narrow terminal, and a line saying how to use one."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from clusterplan.planner.report.text import GIB, human_count, keep_whole, make_table
from clusterplan.topologies.precisions import OWN_RATE_PRECISIONS


def models_table(rows: list[dict], console: Console) -> None:
    """``rows``: the catalogue's entries as dicts, each with its ``job_defaults``."""
    table = make_table("id", "aliases", "name", ("params", "right"), ("active", "right"), ("batch x seq", "right"))
    for r in rows:
        d = r["job_defaults"]
        active = "" if r["num_active_params"] == r["num_params"] else human_count(r["num_active_params"])
        batch = f"{d['global_batch_size'] or '?'} x {d['seq_len']}"
        table.add_row(r["id"], ", ".join(r["aliases"]), r["name"], human_count(r["num_params"]), active, batch)
    _print_catalogue(table, "pass --model ID (or an alias), or the path of a YAML/JSON file or HF config.json", console)


def clusters_table(rows: list[dict], console: Console) -> None:
    """``rows``: the presets (``topologies.library.list_clusters``) as dicts."""
    table = make_table("id", "aliases", "family", "device", ("devices", "right"), ("per node", "right"))
    for r in rows:
        table.add_row(r["id"], ", ".join(r["aliases"]), r["family"], r["device"], f"{r['reference_size']:,}",
                      str(r["devices_per_node"]))
    _print_catalogue(table, "pass --cluster ID with --devices N or --nodes N, or the path of a cluster YAML file",
                     console)


def devices_table(devices: list, console: Console) -> None:
    """``devices``: the bundled :class:`~topologies.devices.DeviceSpec` list, in SI units."""
    table = make_table("id", "family", ("memory", "right"), ("bf16 TFLOP/s", "right"), ("fp8 TFLOP/s", "right"),
                       ("mem TB/s", "right"), ("power W", "right"), ("$/hour", "right"))
    for d in devices:
        fp8 = d.peak_flops_per_s.get("fp8")
        table.add_row(d.id, d.family, f"{d.memory_bytes / GIB:.1f} GiB {d.memory_kind.upper()}",
                      f"{d.peak('bf16') / 1e12:,.0f}", "-" if not fp8 else f"{fp8 / 1e12:,.0f}",
                      f"{d.memory_bytes_per_s / 1e12:,.2f}", "-" if d.power_w is None else f"{d.power_w:.0f}",
                      "-" if d.price_per_hour_usd is None else f"{d.price_per_hour_usd:.2f}")
    _print_catalogue(table, "pass --device ID to swap the device of a preset (same family)", console)
    for precision in OWN_RATE_PRECISIONS:  # --precision values beyond fp8, and the devices whose math runs them
        ids = [d.id for d in devices if precision in d.low_precisions()]
        if ids:
            console.print(f"--precision {precision}: {', '.join(ids)}")


def _print_catalogue(table: Table, footer: str, console: Console) -> None:
    keep_whole(table)
    console.print(table)
    console.print(footer)
