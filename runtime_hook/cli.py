"""`gpuwire` subcommands of the node side (see gpuwire/cli.py for the table).

`grant verify` is the admin's first troubleshooting step: given a container spec it runs
the same decision as the shim and the prestart hook (`runtime_hook.trust.evaluate`),
without claiming allocation tokens, and says what the container would get and why.
"""

from __future__ import annotations

import argparse
import json
import os

from runtime_hook import config, trust


def explain(outcome: trust.Outcome, settings: config.Config) -> list[str]:
    """The verdict and every fact it rests on, one `label  text` line each."""
    request = outcome.request
    who = "/".join(request.names) if request.names else "(no CRI namespace/name annotations)"
    sandbox = f" (sandbox {request.sandbox[:12]})" if request.sandbox else ""
    lines = [
        f"container   {who}{sandbox}",
        f"request     {request.describe()}",
        f"grant       {outcome.grant_explanation}",
    ]
    allocations = [
        f"{t.token}: {t.error}"
        if t.error or t.allocation is None
        else f"{t.token}: valid, GPUs {', '.join(t.allocation.devices)}"
        for t in outcome.tokens
    ]
    lines += [f"allocation  {a}" for a in allocations or ["none"]]
    lines.append(f"privileged  {'yes (CAP_SYS_ADMIN)' if request.privileged else 'no'}")
    lines.append(f"trust       {settings.trust} (config: {settings.source})")
    for key, values in request.conflicts.items():
        lines.append(
            f"note        {key} is set {len(values)} times ({', '.join(values)}): "
            "the last value counts"
        )
    for token in request.stray_tokens:
        lines.append(
            f"note        allocation mount {token} ignored: its source is not in "
            f"{settings.allocation_dir}"
        )
    verdict = outcome.verdict
    if outcome.error is not None:
        decision = f"cannot start: {outcome.error}"
    elif verdict.status == trust.GRANTED:
        gpus = ", ".join(f"{d.index} ({d.uuid})" for d in outcome.devices) or "none"
        decision = (
            f"honoured ({verdict.basis}): GPUs {gpus}; "
            f"capabilities {','.join(outcome.capabilities)}"
        )
    else:
        decision = f"{verdict.status}: {verdict.reason}"
    lines.append(f"decision    {decision}")
    return lines


def grant_verify(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire grant verify",
        description="Explain whether this node would honour a container's GPU request, and why. "
        "Exit status: 0 honoured or no GPU asked for, 1 refused or cannot start, 2 bad input.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--bundle", help="an OCI bundle directory (reads its config.json)")
    source.add_argument("--spec", help="an OCI runtime spec (config.json)")
    parser.add_argument(
        "--config", help=f"node configuration (default: ${config.ENV}, else {config.DEFAULT_PATH})"
    )
    args = parser.parse_args(argv)
    path = args.spec or os.path.join(args.bundle, "config.json")
    try:
        settings = config.load(args.config)
        with open(path, "rb") as f:
            spec = json.load(f)
        if not isinstance(spec, dict):
            raise ValueError("not a JSON object")
    except config.ConfigError as exc:
        parser.exit(2, f"gpuwire grant verify: {exc}\n")
    except (OSError, ValueError) as exc:
        parser.exit(2, f"gpuwire grant verify: cannot read spec {path}: {exc}\n")
    outcome = trust.evaluate(spec, settings, claim=False)
    print("\n".join(explain(outcome, settings)))
    refused = outcome.error is not None or outcome.verdict.status == trust.REFUSED
    return 1 if refused else 0
