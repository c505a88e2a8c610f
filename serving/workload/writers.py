"""Write a ``Trace`` in any of the three formats, so that ``read_trace`` gives it back.

What each format can hold, and so what survives a round trip:

* azure: wall-clock TIMESTAMP at 100 ns resolution (7 fractional digits), CRLF line endings, prompt and
  output tokens. A trace without ``start_time`` is written from ``DEFAULT_START`` (2000-01-01 00:00:00).
  Model, failure and priority are not representable and are dropped.
* mooncake: integer ms from the first arrival (times are rounded to the ms), lengths, and, where
  ``extra["prefix_blocks"]`` >= 0, that many ``hash_ids`` (fresh ids, no two requests share a prefix).
* burstgpt: Timestamp in seconds (shortest repr that reads back exactly), Model names (``unknown`` where
  the code is -1), Response tokens 0 for failed rows (the format flags failures only that way),
  Total tokens = Request + Response, Log Type from ``extra["log_type"]`` (default Conversation log).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from serving.workload import formats as F
from serving.workload.trace import Trace

DEFAULT_START = pd.Timestamp("2000-01-01 00:00:00")
UNKNOWN_MODEL = "unknown"


def _azure_lines(trace: Trace) -> list[str]:
    start = DEFAULT_START if trace.start_time is None else pd.Timestamp(trace.start_time)
    if start.tzinfo is not None:
        start = start.tz_convert("UTC").tz_localize(None)
    ticks = np.round(trace.arrival_s * 1e7).astype(np.int64) * 100  # 100 ns resolution, as the format
    stamps = np.asarray(start.as_unit("ns").to_datetime64()).astype("datetime64[ns]") + ticks.astype(
        "timedelta64[ns]"
    )
    text = np.datetime_as_string(stamps, unit="ns").astype("U27")  # YYYY-MM-DDTHH:MM:SS.fffffff
    text = np.char.replace(text, "T", " ")
    body = pd.DataFrame(
        {"TIMESTAMP": text, "ContextTokens": trace.prompt_tokens, "GeneratedTokens": trace.output_tokens}
    )
    return [
        ",".join(F.AZURE_COLUMNS),
        *body.to_csv(index=False, header=False, lineterminator="\n").splitlines(),
    ]


def _burstgpt_frame(trace: Trace) -> pd.DataFrame:
    names = np.array([*trace.model_names, UNKNOWN_MODEL], dtype=object)
    model = names[np.where(trace.model >= 0, trace.model, len(trace.model_names))]
    response = np.where(trace.failed, 0, trace.output_tokens)
    log_codes = trace.extra.get("log_type", np.zeros(len(trace), dtype=np.int8))
    return pd.DataFrame(
        {
            "Timestamp": trace.arrival_s,
            "Model": model,
            "Request tokens": trace.prompt_tokens,
            "Response tokens": response,
            "Total tokens": trace.prompt_tokens + response,
            "Log Type": np.array(F.BURSTGPT_LOG_TYPES, dtype=object)[log_codes],
        }
    )


def _mooncake_lines(trace: Trace) -> list[str]:
    ms = np.round(trace.arrival_s * 1000.0).astype(np.int64)
    blocks = trace.extra.get("prefix_blocks", np.full(len(trace), -1, dtype=np.int32))
    next_id = np.concatenate(([0], np.cumsum(np.maximum(blocks, 0))))
    lines = []
    # One line of text per request is unavoidable in JSONL; the lists are built per row here.
    for i, (t, p, o, b) in enumerate(
        zip(
            ms.tolist(),
            trace.prompt_tokens.tolist(),
            trace.output_tokens.tolist(),
            blocks.tolist(),
            strict=True,
        )
    ):
        record: dict[str, object] = {"timestamp": t, "input_length": p, "output_length": o}
        if b >= 0:
            record["hash_ids"] = list(range(int(next_id[i]), int(next_id[i]) + b))
        lines.append(json.dumps(record))
    return lines


def write_trace(trace: Trace, path: str | Path, fmt: str) -> Path:
    """Write ``trace`` to ``path`` in format ``fmt`` (azure | mooncake | burstgpt); returns the path.

    Example: ``write_trace(generate(SyntheticParams(duration_s=60), seed=1), "w.csv", "azure")``
    """
    F.check_format(fmt)
    p = Path(path)
    if len(trace) == 0:
        raise ValueError("write_trace: the trace has no rows, and an empty trace file cannot be read back")
    if fmt == F.BURSTGPT:
        _burstgpt_frame(trace).to_csv(p, index=False, lineterminator="\n")
        return p
    if fmt == F.AZURE:
        p.write_bytes(("\r\n".join(_azure_lines(trace)) + "\r\n").encode())
    else:
        p.write_text("\n".join(_mooncake_lines(trace)) + "\n", encoding="utf-8")
    return p
