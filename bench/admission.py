"""The webhook's own work per admission, in this process: what `bench.webhook` measures
through the server, without HTTP, TLS or the event loop.

Each admission of `bench.webhook`'s mix (its example policy, cluster and a grant key) is read,
decided, put in its log line's words and answered, as the server does (`webhook.review`,
`Sources.decide`), each with its own request UID as the API server sends them (a grant binds
its admission, so no work may be shared across UIDs). Reported against decoding the same
bodies alone (orjson), in the same run: the ratio stays where the machine's speed does not.

For figures free of other load, count instructions: run it twice under valgrind with two
`--count`s, one round and no floor, and divide the difference by the difference of the counts
(the start, imports and warm-up cancel out):

    valgrind --tool=callgrind python -m bench.admission --count 100 --rounds 1 --no-floor
    valgrind --tool=callgrind python -m bench.admission --count 600 --rounds 1 --no-floor

    python -m bench.admission [--count 4000] [--rounds 5] [--no-floor]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from bench.webhook import EXAMPLES, workload
from webhook import review
from webhook.sources import Sources, fleet_file


def bodies(count: int) -> list[bytes]:
    """`count` reviews cycling through the mix, each with a request UID of its own."""
    mix = workload()
    return [
        mix[i % len(mix)].replace(f'"bench-{i % len(mix)}"'.encode(), f'"uid-{i:08d}"'.encode())
        for i in range(count)
    ]


def admission(sources: Sources) -> Callable[[bytes], bytes]:
    def answer(body: bytes) -> bytes:
        reviewed = review.parse(body)
        outcome = review.outcome_of(reviewed, sources.decide)
        review.decision(reviewed, outcome)
        return review.encode(review.response(reviewed, outcome))

    return answer


def best(call: Callable[[bytes], object], items: list[bytes], rounds: int) -> float:
    """The fastest round's seconds per item (other load only ever slows a round down)."""
    fastest = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for item in items:
            call(item)
        fastest = min(fastest, time.perf_counter() - started)
    return fastest / len(items)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.admission")
    parser.add_argument("--count", type=int, default=4000, help="admissions a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-floor", action="store_true", help="admissions alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as keys:
        Path(keys, "bench-1").write_text("bench-secret")
        sources = Sources.load(
            str(EXAMPLES / "policy.yaml"), keys, fleet_file(EXAMPLES / "nodes.yaml")
        )
        answer = admission(sources)
        items = bodies(args.count)
        for body in items[:64]:  # warm: the memos a Deployment's first pod fills
            answer(body)
        spent = best(answer, items, args.rounds)
        floor = None if args.no_floor else best(orjson.loads, items, args.rounds)
    print(f"admission in process, {args.count} a round, best of {args.rounds}")
    if floor is None:
        print(f"an admission: {spent * 1e6:.1f} µs")
        return
    print(f"decoding the body (floor): {floor * 1e6:.1f} µs")
    print(f"an admission: {spent * 1e6:.1f} µs, {spent / floor:.1f}× the floor")


if __name__ == "__main__":
    main()
