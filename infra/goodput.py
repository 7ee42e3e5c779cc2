"""What `ftfleet plan --state-gib S` predicts for a stack: spot interruptions, the
checkpoint's cost on its fast tier, the checkpoint interval, the goodput, and the price
of a useful GPU-hour. No torch, no account: arithmetic on the stack's settings, the
catalog's prices (infra/estimate.py) and what the caller says of the job.

* **Interruptions.** A spot node is interrupted at a rate from a monthly share ``p`` of a
  type's instances interrupted, ``-ln(1 - p) / 730`` per hour. ``p`` comes from the
  Spot Instance Advisor's published data for the stack's region and types (AWS only,
  ``--spot-advisor FILE``: the JSON the advisor page loads, each type's
  "frequency of interruption" band, taken at its upper edge, ``>20%`` at 20%), from
  ``--spot-monthly-share P``, or, with neither, the plan shows the advisor's band edges
  (5%, 10%, 20%) as scenarios. The job fails when any of its spot nodes does: its MTBF
  is one over the sum of their rates (the on-demand coordinator and base are left out).
  Once the fleet has run, ``--observed FILE`` takes the job's own rate instead: the
  interruption record its remediation functions keep beside the checkpoints
  (``<root>/fleet/interruptions.json``, contract.InterruptionPrior), the mean time
  between the job interruptions it holds in its window, as the trainer's adaptive
  interval takes it; its row also shows the monthly share that rate means per node.
* **Checkpoint cost** ``C``: the state (``--state-gib``, every rank's shard together)
  written at the fast tier's aggregate throughput (FSx and Managed Lustre: capacity in
  TiB times throughput per TiB); ``--checkpoint-s`` gives it instead (Parallelstore,
  whose throughput this module does not model, or a measured save). A synchronous
  save's cost: an async save blocks less, so the prediction is a floor.
* **Restart cost** ``R`` (``--restart-s``, default 60 s): from a failure to training
  again; the recovery ladder (docs/RESILIENCE.md) measures it.
* **Interval and goodput**: Daly's interval and his goodput model
  (:func:`ftfleet.trainer.resilience.interval.adaptive.daly_goodput`), the same the
  trainer's adaptive interval and the goodput benchmark use.
* **The price of a useful GPU-hour**: the fleet's $/hour over its GPUs times the goodput,
  for the configured mix, and all on-demand (no spot interruption: goodput 1).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftfleet import contract
from ftfleet.errors import ConfigError
from ftfleet.infra import catalog
from ftfleet.trainer.resilience.interval.adaptive import daly_goodput, daly_interval

HOURS_PER_MONTH = 730.0
#: The Spot Instance Advisor's bands' upper edges, the scenarios shown without data.
SCENARIOS = (0.05, 0.10, 0.20)
#: ``>20%`` has no upper edge: taken at its lower one.
OPEN_BAND = 0.20
DEFAULT_RESTART_S = 60.0
MB = 1e6
GIB = 2**30


def node_rate_per_hour(monthly_share: float) -> float:
    """Interruptions per node-hour when ``monthly_share`` of the nodes are interrupted
    in a month (a constant rate)."""
    if not 0 <= monthly_share < 1:
        raise ConfigError(f"a monthly interruption share of {monthly_share!r}: give a fraction from 0 to below 1")
    return -math.log1p(-monthly_share) / HOURS_PER_MONTH


def advisor_shares(path: Path, region: str, types: tuple[str, ...]) -> dict[str, tuple[str, float]]:
    """Each of ``types``' band in ``region`` (Linux) from the Spot Instance Advisor's
    JSON: type -> (its label, its monthly share). One-line ConfigError otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ranges = {int(r["index"]): (str(r["label"]), float(r["max"])) for r in data["ranges"]}
        linux = data["spot_advisor"][region]["Linux"]
    except FileNotFoundError:
        raise ConfigError(f"--spot-advisor {path}: no such file") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"--spot-advisor {path}: not the Spot Instance Advisor's data for {region} ({type(exc).__name__}: {exc}); "
            "download https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
        ) from None
    bands = {name: linux[name].get("r", -1) for name in types if isinstance(linux.get(name), Mapping)}
    missing = [name for name in types if int(bands.get(name, -1)) not in ranges]
    if missing:
        raise ConfigError(f"--spot-advisor {path}: no band for {missing[0]} in {region}; give --spot-monthly-share")
    return band_shares(ranges, bands, types)


def band_shares(
    ranges: Mapping[int, tuple[str, float]], bands: Mapping[str, Any], types: tuple[str, ...]
) -> dict[str, tuple[str, float]]:
    """type -> (its band's label, its monthly share: the band's upper edge, the open
    band's at its lower one) for ``types``, each of which has a band in ``ranges``."""
    out = {}
    for name in types:
        label, top = ranges[int(bands[name])]
        out[name] = (label, OPEN_BAND if top >= 100 else top / 100)  # the open band's max is 100
    return out


def catalog_prior(s: Any) -> tuple[float, str] | None:
    """(the fleet's monthly share, a label naming the source and its date) from the
    catalog's dated bands, where they are for the stack's region: the mean of its spot
    types' shares, over the types the copy has a band for (the others named)."""
    prior = catalog.spot_interruption_prior(s.cloud)
    if not prior or prior.get("region") != s.region:
        return None
    types = spot_types(s)
    known = tuple(t for t in types if t in prior["bands"])
    if not known:
        return None
    ranges = {int(r["index"]): (str(r["label"]), float(r["max"])) for r in prior["ranges"]}
    shares = band_shares(ranges, prior["bands"], known)
    mean = sum(p for _, p in shares.values()) / len(shares)
    bands = ", ".join(f"{t} {label}" for t, (label, _) in shares.items())
    unknown = [t for t in types if t not in known]
    lacking = f"; {', '.join(unknown)}: no band in that copy" if unknown else ""
    return mean, f"catalog: the advisor's bands as of {prior['as_of']}, {bands}{lacking}"


def observed_rate(path: Path, s: Any, now: float) -> tuple[float, str]:
    """(the job's interruptions per hour, a label) from the fleet's interruption record
    at ``path``; one-line ConfigError for a file that is not this run's record, or one
    with fewer than two job interruptions in its window."""
    try:
        prior = contract.InterruptionPrior.from_json(path.read_bytes())
    except FileNotFoundError:
        raise ConfigError(f"--observed {path}: no such file") from None
    except (OSError, contract.ContractError) as exc:
        raise ConfigError(
            f"--observed {path}: not the fleet's interruption record ({exc}); copy "
            f"<checkpoint_uri>/{contract.INTERRUPTION_PRIOR_KEY} from the stack's bucket"
        ) from None
    if prior.cloud != s.cloud or prior.run_id != s.trainer.run_id:
        raise ConfigError(
            f"--observed {path}: the record of run {prior.run_id!r} on {prior.cloud}, not {s.stack}'s "
            f"({s.trainer.run_id!r} on {s.cloud})"
        )
    starts = prior.job_interruptions(now)
    mtbf_s = prior.mtbf_s(now)
    if mtbf_s is None or mtbf_s <= 0:
        raise ConfigError(
            f"--observed {path}: {len(starts)} job interruption(s) in its window, fewer than the two a rate needs; "
            "give --spot-monthly-share"
        )
    days = (now - starts[0]) / 86400
    return 3600.0 / mtbf_s, f"observed: {len(starts)} job interruptions in {days:.1f} days"


def fast_tier_mb_s(s: Any) -> float | None:
    """The fast tier's aggregate throughput in MB/s, where its settings say it."""
    st = s.storage
    if s.cloud == "aws":
        return st.fsx_storage_capacity_gib / 1024 * st.fsx_throughput_per_tib
    if st.kind == "managed-lustre":
        return st.lustre_capacity_gib / 1024 * st.lustre_throughput_per_tib
    return None


def spot_types(s: Any) -> tuple[str, ...]:
    return tuple(s.fleet.worker_instance_types) if s.cloud == "aws" else tuple(s.fleet.worker_machine_types)


def predict(
    s: Any,
    est: dict[str, Any],
    *,
    state_gib: float,
    restart_s: float = DEFAULT_RESTART_S,
    checkpoint_s: float | None = None,
    monthly_share: float | None = None,
    advisor: Path | None = None,
    observed: Path | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The prediction for stack settings ``s`` with its cost estimate ``est``: one row per
    interruption scenario (a single row when the share is known)."""
    if not state_gib > 0:
        raise ConfigError(f"--state-gib {state_gib!r}: give the model and optimizer state in GiB (> 0)")
    if not restart_s >= 0:
        raise ConfigError(f"--restart-s {restart_s!r}: give seconds (>= 0)")
    if checkpoint_s is None:
        mb_s = fast_tier_mb_s(s)
        if not mb_s:
            raise ConfigError(f"{s.stack}: its fast tier's throughput is not modelled; give --checkpoint-s")
        checkpoint_s = state_gib * GIB / MB / mb_s
        cost_from = f"{state_gib:g} GiB at {mb_s:,.0f} MB/s"
    else:
        if not checkpoint_s >= 0:
            raise ConfigError(f"--checkpoint-s {checkpoint_s!r}: give seconds (>= 0)")
        cost_from = "given"
    spot_nodes = est["nodes"]["workers_spot"]
    if observed is not None:
        job_rate, source = observed_rate(observed, s, time.time() if now is None else now)
        share = -math.expm1(-job_rate / max(spot_nodes, 1) * HOURS_PER_MONTH)
        shares = [(share, source)]
    elif advisor is not None:
        if s.cloud != "aws":
            raise ConfigError("--spot-advisor: AWS publishes the advisor's bands; on GCP give --spot-monthly-share")
        bands = advisor_shares(advisor, s.region, spot_types(s))
        # Spot capacity spreads over every listed type: the mean of their shares.
        shares = [
            (sum(p for _, p in bands.values()) / len(bands), ", ".join(f"{t} {b}" for t, (b, _) in bands.items()))
        ]
    elif monthly_share is not None:
        shares = [(monthly_share, "given")]
    else:
        shares = [(p, f"scenario: {p:.0%} a month") for p in SCENARIOS]
        prior = catalog_prior(s)
        if prior is not None:
            shares.insert(0, prior)
    gpus = est["nodes"]["gpus"]
    fleet = est["fleet_usd_per_hour"]
    rows = []
    for share, source in shares:
        per_hour = job_rate if observed is not None else node_rate_per_hour(share) * spot_nodes
        if per_hour > 0:
            mtbf_s = 3600.0 / per_hour
            interval_s = daly_interval(checkpoint_s, mtbf_s)
            goodput = daly_goodput(interval_s, checkpoint_s, restart_s, mtbf_s)
        else:
            mtbf_s, interval_s, goodput = math.inf, math.inf, 1.0
        rows.append(
            {
                "monthly_share": round(share, 4),
                "source": source,
                "interruptions_per_hour": round(per_hour, 4),
                "mtbf_s": round(mtbf_s, 1),
                "interval_s": round(interval_s, 1),
                "goodput": round(goodput, 4),
                "usd_per_useful_gpu_hour": round(fleet["with_spot"] / (gpus * goodput), 3) if goodput > 0 else None,
            }
        )
    return {
        "checkpoint_s": round(checkpoint_s, 2),
        "checkpoint_from": cost_from,
        "restart_s": restart_s,
        "spot_nodes": spot_nodes,
        "gpus": gpus,
        "usd_per_useful_gpu_hour_on_demand": round(fleet["all_on_demand"] / gpus, 3),
        "rows": rows,
    }


def lines(pred: dict[str, Any]) -> list[str]:
    """The plan's lines for a prediction."""
    out = [
        f"Goodput (PREDICTION, Daly's model): checkpoint {pred['checkpoint_s']:g} s ({pred['checkpoint_from']}; "
        f"a synchronous save), restart {pred['restart_s']:g} s, {pred['spot_nodes']} spot nodes",
    ]
    for r in pred["rows"]:
        out.append(
            f"  {r['monthly_share']:.0%} of spot nodes interrupted a month ({r['source']}): "
            f"{r['interruptions_per_hour']:.3f} interruptions/hour, interval {r['interval_s']:,.0f} s, "
            f"goodput {r['goodput']:.3f}, ${r['usd_per_useful_gpu_hour']:,.2f} per useful GPU-hour"
        )
    out.append(f"  all on-demand: ${pred['usd_per_useful_gpu_hour_on_demand']:,.2f} per useful GPU-hour (goodput 1)")
    return out
