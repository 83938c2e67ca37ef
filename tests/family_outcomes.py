"""What the family sweeps (`test_every_family.py`, keras-hub's; `test_every_hugging_face_family.py`) share: which
families a run takes, a stage's outcome, None where it passed or its refusal's first line, and the check that a
family meets exactly the refusals its table records, so that the table shrinks as the mechanisms grow."""

import os
import re


def families_today(families, slow, variable):
    """The families this run takes: the environment `variable` says how many of today's share
    (conftest.todays_share; 1 where unset), "all", or names, comma-separated; the share leaves out the `slow`
    ones, which only "all" and names take."""
    from conftest import todays_share  # the suite's; the sweeps, which import this module too, take no share

    count = os.environ.get(variable, "1")
    if count == "all":
        return sorted(families)
    if not count.isdigit():
        return sorted(count.split(","))
    return todays_share(sorted(family for family in families if family not in slow), int(count))


def first_line(error):
    text = getattr(error, "message", None) or str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


class Outcomes(dict):
    """{stage: None where it passed, else its one-line refusal}."""

    def attempt(self, stage, action):
        try:
            action()
            self[stage] = None
        except Exception as error:  # noqa: BLE001 - a refusal of any kind is the stage's outcome
            self[stage] = first_line(error)


def assert_as_recorded(family, outcomes, not_yet):
    """Each stage passed, except those `not_yet` ({family: {stage: pattern}}) records, which must still be refused
    with a line its pattern finds."""
    expected = not_yet.get(family, {})
    for stage, refusal in outcomes.items():
        if stage in expected:
            assert refusal is not None, f"{family} passes {stage} now: take it out of NOT_YET"
            assert re.search(expected[stage], refusal), (stage, refusal)
        else:
            assert refusal is None, f"{family}, {stage}: {refusal}"
