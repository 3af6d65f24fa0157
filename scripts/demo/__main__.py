"""`make demo` (`python -m scripts.demo`): the whole system on a simulated GPU node.

Exit status 0 when every scenario that could be checked came out as expected, 1 otherwise;
everything it started is stopped and removed either way, on Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable

from scripts.demo import amd, cluster, dra, holders, show
from scripts.demo.scenarios import AMD_SCENARIOS, DRA_SCENARIOS, SCENARIOS, play


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds the cluster's context: everything is stopped


def say(lines: Iterable[str]) -> None:
    print("\n".join(lines), flush=True)


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupted)
    style = show.Style(sys.stdout.isatty() and "NO_COLOR" not in os.environ)
    say([style.title("gpuwire demo: pods get GPUs by annotation, on simulated nodes"), ""])
    try:
        with cluster.up() as running:
            say(show.node(running, style))
            results, outcomes = [], []
            for number, item in enumerate(SCENARIOS, 1):
                outcome = play(running, item)
                outcomes.append(outcome)
                results.append((item.key, item.expected, item.judge(outcome, running.devices)))
                say(show.scenario(number, item, outcome, running.devices, style))
            node = dra.join(running, DRA_SCENARIOS[0].load())
            say(show.dra_node(node, style))
            for number, item in enumerate(DRA_SCENARIOS, len(SCENARIOS) + 1):
                outcome = play(running, item, node)
                outcomes.append(outcome)
                results.append((item.key, item.expected, item.judge(outcome, node.devices)))
                say(show.scenario(number, item, outcome, node.devices, style))
            amd_node = amd.join(running, AMD_SCENARIOS[0].load())
            say(show.amd_node(amd_node, style))
            for number, item in enumerate(AMD_SCENARIOS, len(outcomes) + 1):
                outcome = play(running, item, amd_node=amd_node)
                outcomes.append(outcome)
                results.append((item.key, item.expected, item.judge(outcome, amd_node.devices)))
                say(show.scenario(number, item, outcome, amd_node.devices, style))
            taken = holders.take(running, outcomes, node.devices, amd_node.devices)
            results.append(("inventory", "each pod on its GPUs", holders.judge(taken)))
            results.append(("inventory-dra", "DRA pods on their claims", holders.judge_dra(taken)))
            results.append(("inventory-amd", "AMD pods on their GPUs", holders.judge_amd(taken)))
            say(show.inventory(len(outcomes) + 1, taken, running, style))
            say(show.summary(results, running, style, node))
            say(show.by_hand(running, [taken.step], style))
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started is stopped and removed", file=sys.stderr)
        return 130
    return 0 if all(verdict.ok is not False for _, _, verdict in results) else 1


if __name__ == "__main__":
    sys.exit(main())
