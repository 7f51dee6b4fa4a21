"""The long corpus's Debian sources: the Linux kernel's and Python's Sphinx sources, Perl's POD, the GNU standards.

For each, the first package name apt knows (Debian 12, then 13) is used; the .deb's own version is recorded."""

from __future__ import annotations

import gzip
import re

from ..registry_files import fetch_deb_package
from .base import LongSource, archive_docs, utf8
from .text import PARAGRAPH

LINUX_DOC = (("linux-doc-6.12", "linux-doc-6.1"), "usr/share/doc/linux-doc-*/html/_sources/*.rst.txt")
PYTHON_DOC = (("python3.11-doc", "python3.13-doc", "python3.12-doc"), "usr/share/doc/python3.*/html/_sources/*.rst.txt")
PERL_DOC = (("perl-doc",), "usr/share/perl/*/pod/*.pod")
GNU_STANDARDS = (("gnu-standards",), "usr/share/doc/gnu-standards/*.text.gz")


def _deb_docs(spec, decode=utf8):
    names, pattern = spec
    deb = fetch_deb_package(*names)
    return archive_docs(f"Debian {deb.name}", deb, pattern, decode)


_POD_CODE = re.compile(r"([A-Z])<<+\s+(.+?)\s+>>+|([A-Z])<([^<>]*)>", re.S)
_POD_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&"}


def _pod_code(m: re.Match) -> str:
    code, body = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if code in "XZ":  # index entries, null
        return ""
    if code == "E":  # kept out of the way of the outer codes' angle brackets until the end
        return {"lt": "\ue000", "gt": "\ue001"}.get(body) or _POD_ESCAPES.get(body, chr(int(body)) if body.isdigit() else body)
    if code == "L":  # L<text|target> -> text, L<name/"section"> -> name section
        return body.split("|", 1)[0].replace('/"', " ").strip('"')
    return body


def pod_text(pod: str) -> str:
    """Perl POD as plain text: headings and items kept as lines, other commands dropped, formatting codes
    (B<>, C<>, I<>, L<>, E<>, ...) replaced by their text."""
    out = []
    for para in PARAGRAPH.split(pod.replace("\r\n", "\n")):
        if para.startswith("="):
            command, _, rest = para[1:].partition(" ")
            if command.startswith("head"):
                para = rest.strip()
            elif command == "item":
                para = "* " + rest.strip().removeprefix("*").strip() if rest.strip() not in ("*", "") else ""
            else:
                continue  # =over, =back, =cut, =pod, =encoding, =for, =begin, =end
        for _ in range(5):  # codes nest: C<B<x>> needs two passes
            new = _POD_CODE.sub(_pod_code, para)
            if new == para:
                break
            para = new
        if para.strip():
            out.append(para.replace("\ue000", "<").replace("\ue001", ">"))
    return "\n\n".join(out)


def _registry(spec) -> str:
    return f"Debian package {' or '.join(spec[0])}"


SOURCES = (
    LongSource("linux-doc", _registry(LINUX_DOC), lambda: _deb_docs(LINUX_DOC)),
    LongSource("python-doc", _registry(PYTHON_DOC), lambda: _deb_docs(PYTHON_DOC)),
    LongSource("perl-doc", _registry(PERL_DOC), lambda: _deb_docs(PERL_DOC, lambda b: pod_text(utf8(b)))),
    LongSource("gnu-standards", _registry(GNU_STANDARDS),
               lambda: _deb_docs(GNU_STANDARDS, lambda b: utf8(gzip.decompress(b)))),
)
