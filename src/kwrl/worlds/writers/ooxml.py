"""Make an OOXML package (docx, xlsx, pptx) depend on nothing but its content and one date.

A world must render to the same bytes on every run, but the office libraries leak the wall clock
into their output in three places:

- every zip entry carries the time of saving (python-docx, python-pptx, openpyxl);
- `docProps/core.xml` gets `created`/`modified` stamped at save time (openpyxl always overrides
  `modified`; python-pptx and python-docx fill in "now" for unset properties);
- python-pptx embeds each chart's data as an xlsx written by XlsxWriter, whose own core.xml
  carries the current time.

`normalize_package` fixes all three after the library has saved: it rewrites every entry in the
original order with a fixed zip timestamp and attributes, stamps the core properties with the
model's date, and recurses into embedded packages. Writers that need to edit a part after saving
(the xlsx writer adds cached formula values) pass a patch for that part instead of unzipping and
rezipping a second time.
"""

from __future__ import annotations

import datetime as dt
import io
import zipfile
from collections.abc import Callable, Mapping

from lxml import etree

FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
"""The earliest time a zip entry can carry; what reproducible-build tools use."""

CORE_PART = "docProps/core.xml"
DCTERMS_NS = "http://purl.org/dc/terms/"
EMBEDDED_PACKAGE_SUFFIXES = (".xlsx", ".docx", ".pptx")

PartPatch = Callable[[bytes], bytes]
"""Rewrites one part's bytes (e.g. a worksheet's XML) during normalization."""


def package_datetime(date: dt.date) -> dt.datetime:
    """The naive UTC datetime the libraries expect for core properties: midnight of `date`."""
    return dt.datetime.combine(date, dt.time())


def normalize_package(
    package: bytes, date: dt.date, patches: Mapping[str, PartPatch] | None = None
) -> bytes:
    """Return `package` rewritten with fixed zip metadata and core dates set to `date`.

    `patches` maps a part name (e.g. `xl/worksheets/sheet1.xml`) to a function applied to its
    bytes. Entry order is kept: `[Content_Types].xml` stays where the library put it.
    """
    patches = patches or {}
    output = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(package)) as source,
        zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for info in source.infolist():
            data = source.read(info)
            if info.filename == CORE_PART:
                data = _stamp_core_dates(data, date)
            elif info.filename.endswith(EMBEDDED_PACKAGE_SUFFIXES) and _is_zip(data):
                data = normalize_package(data, date)
            if info.filename in patches:
                data = patches[info.filename](data)
            target.writestr(_fixed_zip_info(info.filename), data)
    return output.getvalue()


def _fixed_zip_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=FIXED_ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    # Unix, rw-r--r--: explicit, so neither the host OS nor the umask shows in the file.
    # (zipfile replaces an external_attr of 0 by 0o600 << 16, so 0 cannot be chosen.)
    info.create_system = 3
    info.external_attr = 0o644 << 16
    return info


def _stamp_core_dates(core_xml: bytes, date: dt.date) -> bytes:
    root = etree.fromstring(core_xml)
    stamp = f"{date.isoformat()}T00:00:00Z"
    for name in ("created", "modified"):
        for element in root.iter(f"{{{DCTERMS_NS}}}{name}"):
            element.text = stamp
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8", standalone=True)


def _is_zip(data: bytes) -> bool:
    return zipfile.is_zipfile(io.BytesIO(data))
