"""A run's results as the Serving Engine page lays them out, as plain data (no streamlit): the load plan its boxes
describe (`load_plan`) and their first values (`load_defaults`), each point's x label (`x_label`), the points
table's columns (`stat_keys`), one load run's tables and charts' inputs (`Sweep`), and which prompt tokens an
engine serves from its cache (`prefix_rule`). The page translates the keys and draws; nothing here measures."""
from __future__ import annotations

from dataclasses import dataclass

from kvviz.errors import InputError
from kvviz.serving.bench import METRICS, BenchPlan, Limits, closed_loop, open_loop, vllm_result
from kvviz.serving.workload import Workload


def parse_list(text: str, kind: type) -> list:
    """"1, 2,4" -> [1, 2, 4]; a part `kind` cannot read raises ValueError."""
    return [kind(p) for p in text.replace(" ", "").split(",") if p]


def load_plan(*, url: str, model: str, endpoint: str, timeout_s: float, mode: str, concurrency: str, rates: str,
              max_concurrency: int, burstiness: float, requests: int, prompt_tokens: int, max_tokens: int,
              range_ratio: float, prefix_len: int, warmups: int, slo_ttft_ms: float, slo_tpot_ms: float,
              dataset_path: str | None = None, keep_cache_ids: bool = False) -> BenchPlan:
    """The plan the load boxes describe. mode "closed": one point per concurrency in `concurrency`; "open": one per
    request rate in `rates`, each capped at `max_concurrency` (0: no cap) with `burstiness`. An SLO of 0 is none.
    keep_cache_ids: keep each prompt's ids for its attribution to the server's cached blocks (kvviz.serving.kv_run)."""
    try:
        if mode == "closed":
            points = closed_loop(parse_list(concurrency, int))
        else:
            points = open_loop(parse_list(rates, float), max_concurrency or None)
    except ValueError:
        raise InputError("serving.no_points") from None
    goodput = tuple((k, float(v)) for k, v in (("ttft", slo_ttft_ms), ("tpot", slo_tpot_ms)) if v > 0)
    workload = Workload(input_len=prompt_tokens, output_len=max_tokens, range_ratio=range_ratio,
                        prefix_len=prefix_len, dataset_path=dataset_path)
    return BenchPlan(url=url, model=model, points=points, num_prompts=requests, workload=workload,
                     endpoint=endpoint, timeout_s=timeout_s, burstiness=burstiness if mode == "open" else 1.0,
                     num_warmups=warmups, goodput=goodput, keep_cache_ids=keep_cache_ids)


def n_source(tokens_from: list[str]) -> str:
    """Where a run's N came from, worst first: "messages" (counted), "tokenizer" (the text tokenized) or "usage"."""
    return next((s for s in ("messages", "tokenizer") if s in tokens_from), "usage")


def x_label(point: dict) -> str:
    """A point on the load axis: its concurrency ("4", "∞" unbounded) or its rate ("2/s", "2/s ≤4" when capped)."""
    if point["request_rate"] == "inf":
        return str(point["max_concurrency"]) if point["max_concurrency"] else "∞"
    rate = f"{point['request_rate']:g}/s"
    return rate if not point["max_concurrency"] else f"{rate} ≤{point['max_concurrency']}"


def stat_keys(points: list[dict]) -> list[tuple[str, str, str]]:
    """(result key, metric, statistic) for each statistic column, in vLLM's order: mean, median, then the
    percentiles the run computed (p90_ttft_ms -> "p90")."""
    pcts = [k.split("_")[0] for k in points[0] if k.startswith("p") and k.endswith("_ttft_ms")]
    return [(f"{stat}_{metric}_ms", metric, stat) for metric in METRICS for stat in ("mean", "median", *pcts)]


# The server's own counters over each point (prom.window), and the two clocks side by side (bench.server_crosscheck).
WINDOW_COLUMNS = ("x", "prompt_tokens", "cached_tokens", "prefix_cache_hit_rate", "generation_tokens", "preemptions",
                  "prompt_tokens_per_s", "generation_tokens_per_s")
CROSSCHECK_COLUMNS = ("x", "client_mean_ttft_ms", "server_mean_ttft_ms", "server_mean_prefill_ms",
                      "client_mean_tpot_ms", "server_mean_tpot_ms", "server_mean_itl_ms")
REQUEST_COLUMNS = ("point", "start_s", "queue_s", "ttft_s", "tpot_s", "e2e_s", "n_tokens", "prompt_tokens",
                   "cached_tokens", "server_prefill_s", "finish_reason", "error")


@dataclass(frozen=True)
class Sweep:
    """One load run's snapshot (BenchRun.snapshot(), as its worker wrote it) and what the page shows of it: the
    points that sent requests, each with its x label, and the rows of its tables."""

    run: dict

    @property
    def points(self) -> list[dict]:
        return [p for p in self.run.get("points", []) if p["sent"]]

    @property
    def xs(self) -> list[str]:
        return [x_label(p) for p in self.points]

    @property
    def current(self) -> dict | None:
        """The point being measured now (None between points and after the run)."""
        return self.run.get("current")

    def progress(self, total: int) -> tuple[int, int]:
        """(requests done, requests in all); before the run's first snapshot, (0, `total`)."""
        p = self.run.get("progress") or {"done": 0, "total": total}
        return p["done"], p["total"]

    @property
    def notes(self) -> list[dict]:
        """Problems that did not stop the run, less the one that did (shown once, as the error)."""
        return [n for n in self.run.get("notes", []) if n != self.run.get("error")]

    @property
    def exact_prompts(self) -> bool | None:
        """True: the prompts' token counts were exact (token ids sent); False: text; None: not known yet."""
        return self.run.get("exact_prompts")

    @property
    def closed(self) -> bool:
        return all(p["request_rate"] == "inf" for p in self.points)

    def first_last(self) -> dict | None:
        """The first and the last point's median TTFT and TPOT (ms) and output throughput, and how many times the
        first's throughput the last's is (None where either is missing or 0); None with fewer than two points."""
        points, xs = self.points, self.xs
        if len(points) < 2:
            return None
        first, last = points[0], points[-1]
        tps0, tps = first["output_throughput"], last["output_throughput"]
        return {"c0": xs[0], "c": xs[-1], "first_ttft": first["median_ttft_ms"], "ttft": last["median_ttft_ms"],
                "first_tpot": first["median_tpot_ms"], "tpot": last["median_tpot_ms"], "first_tps": tps0,
                "tps": tps, "ratio": tps / tps0 if tps and tps0 else None,
                "tokens_from_usage": self.run.get("tokens_from_usage", True),
                "n_source": n_source(self.run.get("tokens_from") or (
                    ["usage"] if self.run.get("tokens_from_usage", True) else ["messages"]))}

    def point_rows(self) -> list[dict]:
        return [{**p, "x": x} for p, x in zip(self.points, self.xs, strict=True)]

    def window_rows(self) -> list[dict]:
        """The server's counters over each point that has them, the prefix cache's hit rate in percent."""
        rows = [{**p["server"], "x": x} for p, x in zip(self.points, self.xs, strict=True) if p.get("server")]
        return [{**w, "prefix_cache_hit_rate": None if w["prefix_cache_hit_rate"] is None
                 else round(100 * w["prefix_cache_hit_rate"], 2)} for w in rows]

    def crosscheck_rows(self) -> list[dict]:
        return [{**p["server_timings"], "x": x} for p, x in zip(self.points, self.xs, strict=True)]

    def has_server_clock(self) -> bool:
        """Whether the server timed any point itself (llama.cpp's timings, vLLM's histograms)."""
        return any(c["server_mean_prefill_ms"] is not None or c["server_mean_ttft_ms"] is not None
                   for c in self.crosscheck_rows())

    def clocks_agree(self) -> bool | None:
        """Whether the client's TPOT agreed with the server's at every point that compared them; None: none did."""
        agree = [c.get("tpot_agree") for c in self.crosscheck_rows() if c.get("tpot_agree") is not None]
        return all(agree) if agree else None

    def timeline_point(self) -> dict | None:
        """The point whose requests the timeline draws: the one being measured, else the last one measured."""
        return self.current or (self.points[-1] if self.points else None)

    def gauge_samples(self) -> list[dict]:
        """Every /metrics gauge sample of the run, the point being measured included, in order."""
        return [g for p in [*self.points, *([self.current] if self.current else [])] for g in p.get("gauges", [])]

    def request_rows(self) -> list[dict]:
        return [{**r, "point": x_label(p)} for p in self.points for r in p["requests"]]

    def result_files(self, date: str = "kvviz") -> dict[str, dict]:
        """One vLLM-format result per point ("point1", ...), as `serve-bench --save-result` writes them."""
        return {f"point{i + 1}": vllm_result(self.run, p, date) for i, p in enumerate(self.points)}


def prefix_rule(engine: str | None) -> str:
    """How an engine decides which prompt tokens its cache serves: "block" (vLLM: whole blocks only), "token"
    (llama.cpp, SGLang: any common prefix), or "unknown"."""
    return {"vllm": "block", "llama.cpp": "token", "sglang": "token"}.get(engine or "", "unknown")


def load_defaults(limits: Limits) -> dict[str, float]:
    """The load and prefix boxes' first values (by box name, without the page's prefix), within the limits."""
    return {"maxc": 0, "burst": 1.0, "requests": min(8, limits.max_requests),
            "prompt": min(128, limits.max_prompt_tokens), "max_tokens": min(32, limits.max_tokens), "range": 0.0,
            "prefix_len": 0, "warmups": 0, "slo_ttft": 0.0, "slo_tpot": 0.0,
            "prefix_words": min(256, limits.max_prompt_tokens), "prefix_repeats": 5}
