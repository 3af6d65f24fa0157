"""A warning the webhook answers with, and its kind: what the metrics count it by
(`gpuwire_webhook_warnings_total{kind}`) and the log line names.

A `str`, so that the answer, the tests and `gpuwire mutate` read it as the text it is; the
kind rides along. A warning made as a plain string counts as `other`.
"""

from __future__ import annotations

OTHER = "other"


class Warned(str):
    kind: str

    def __new__(cls, kind: str, text: str) -> Warned:
        made = super().__new__(cls, text)
        made.kind = kind
        return made


def kind_of(warning: str) -> str:
    return warning.kind if isinstance(warning, Warned) else OTHER
