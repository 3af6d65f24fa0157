"""`make demo` (`python -m scripts.demo`): the whole system on a simulated GPU node.

Exit status 0 when every scenario that could be checked came out as expected, 1 otherwise;
everything it started is stopped and removed either way, on Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import os
import signal
import sys

from scripts.demo import cluster, show
from scripts.demo.scenarios import SCENARIOS, play


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds the cluster's context: everything is stopped


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupted)
    style = show.Style(sys.stdout.isatty() and "NO_COLOR" not in os.environ)
    print(style.title("gpuwire demo: pods get GPUs by annotation, on one simulated node") + "\n")
    try:
        with cluster.up() as running:
            print("\n".join(show.node(running, style)), flush=True)
            played = []
            example = None
            for number, item in enumerate(SCENARIOS, 1):
                outcome = play(running, item)
                verdict = item.judge(outcome, running.devices)
                played.append((item, verdict))
                lines = show.scenario(number, item, outcome, running.devices, style)
                print("\n".join(lines), flush=True)
                if item.key == "two-gpus" and outcome.containers:
                    example = outcome.containers[0]
            print("\n".join(show.summary(played, running, style)))
            print("\n".join(show.by_hand(running, example, style)))
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started is stopped and removed", file=sys.stderr)
        return 130
    return 0 if all(v.ok is not False for _, v in played) else 1


if __name__ == "__main__":
    sys.exit(main())
