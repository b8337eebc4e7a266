"""What every form that takes a task spec shares (the admin's and the portal's)."""

from __future__ import annotations

from collections.abc import Mapping

from scheduling.spec import SpecError


class SpecRefusals:
    """Puts the parser's or the submit service's ``{field path: [reasons]}`` on a form.

    A path that ``spec_fields`` maps to one of the form's fields shows there, and so does a path
    below it (``env.LR`` on ``env`` as ``LR: reason``, ``policy.after[1]`` on ``after``); any
    other path shows on ``catch_all`` (the form's own errors when None) as ``path: reason``.
    """

    spec_fields: Mapping[str, str] = {}
    catch_all: str | None = None

    def add_refusal(self, exc: SpecError) -> None:
        for path, reasons in exc.errors.items():
            field, below = self._field_for(path)
            for reason in reasons:
                if field is None:
                    self.add_error(self.catch_all, f"{path}: {reason}")
                else:
                    self.add_error(field, f"{below}: {reason}" if below else reason)

    def _field_for(self, path: str) -> tuple[str | None, str]:
        for key, field in self.spec_fields.items():
            if field not in self.fields:
                continue
            if path == key or path.startswith(f"{key}["):
                return field, ""
            if path.startswith(f"{key}."):
                return field, path.removeprefix(f"{key}.")
        return None, path
