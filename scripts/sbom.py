"""The image's software bill of materials, written while the image is built (Containerfile,
runtime stage, after everything it does not ship was purged): SPDX 2.3 JSON on stdout listing
every Debian package dpkg says is installed and every Python distribution of the sidecar's
virtual environment, each with its version and package URL (purl), so an image scanner or an
auditor reads what the image carries from the image itself (/usr/share/doc/pcitopo/sbom.spdx.json).

Standard library only: it runs under the image's own Python before the image exists.
Usage: sbom.py DPKG_STATUS SITE_PACKAGES_DIR [CREATED]   (CREATED: ISO 8601 time, default the epoch;
the build passes its sources' commit time so that the same sources give the same file).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from importlib.metadata import distributions
from pathlib import Path
from urllib.parse import quote


def dpkg_packages(status: Path) -> list[dict]:
    """Installed packages of a dpkg status file (``Status: install ok installed``)."""
    out = []
    for stanza in status.read_text(encoding="utf-8").split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if fields.get("Status") == "install ok installed" and "Package" in fields:
            out.append(fields)
    return sorted(out, key=lambda f: f["Package"])


def pypi_name(name: str) -> str:
    """A distribution's name as PyPI and the purl spec normalise it (PEP 503: runs of -_. become -)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def spdx_package(name: str, version: str, purl: str, supplier: str | None = None) -> dict:
    ident = "SPDXRef-" + hashlib.sha256(purl.encode()).hexdigest()[:16]
    pkg = {"SPDXID": ident, "name": name, "versionInfo": version, "downloadLocation": "NOASSERTION",
           "filesAnalyzed": False, "licenseConcluded": "NOASSERTION", "licenseDeclared": "NOASSERTION",
           "copyrightText": "NOASSERTION",
           "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}]}
    if supplier:
        pkg["supplier"] = f"Organization: {supplier}"
    return pkg


def sbom(status: Path, site: Path, created: str) -> dict:
    packages = []
    for f in dpkg_packages(status):
        arch = f.get("Architecture", "all")
        purl = f"pkg:deb/debian/{quote(f['Package'])}@{quote(f['Version'])}?arch={arch}"
        packages.append(spdx_package(f["Package"], f["Version"], purl, "Debian"))
    for dist in sorted(distributions(path=[str(site)]), key=lambda d: d.metadata["Name"].lower()):
        name, version = dist.metadata["Name"], dist.version
        packages.append(spdx_package(name, version, f"pkg:pypi/{quote(pypi_name(name))}@{quote(version)}"))
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": "pcitopo image", "documentNamespace": "https://spdx.org/spdxdocs/pcitopo-image-"
        + hashlib.sha256(json.dumps([p["externalRefs"][0]["referenceLocator"] for p in packages]).encode()).hexdigest(),
        "creationInfo": {"created": created, "creators": ["Tool: pcitopo scripts/sbom.py"]},
        "packages": packages,
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    created = argv[2] if len(argv) == 3 and argv[2] else "1970-01-01T00:00:00Z"
    json.dump(sbom(Path(argv[0]), Path(argv[1]), created), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
