"""JUnit XML of a gate's checks, the format CI systems (GitHub Actions reporters, GitLab, Jenkins) show
as test results: one testcase per check, a ``failure`` element for each that failed."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from tpusim.testing.budgets import Check


def junit_xml(suite: str, checks: list[Check], time_s: float = 0.0) -> str:
    """The checks as one ``testsuites`` document with one ``testsuite`` named ``suite``."""
    failures = sum(not c.passed for c in checks)
    root = ET.Element("testsuites", name="tpusim check", tests=str(len(checks)), failures=str(failures))
    node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(checks)), failures=str(failures),
                         errors="0", skipped="0", time=f"{time_s:.3f}")
    for check in checks:
        case = ET.SubElement(node, "testcase", classname=suite, name=check.name, time="0")
        if check.passed:
            ET.SubElement(case, "system-out").text = check.message
        else:
            ET.SubElement(case, "failure", message=check.message, type=check.name.split("[")[0]).text = check.message
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
