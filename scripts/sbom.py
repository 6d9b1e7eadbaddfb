"""The image's software bill of materials, written while the image is built (Containerfile,
runtime stage, after everything it does not ship was purged): SPDX 2.3 JSON on stdout listing
every Debian package dpkg says is installed and every Python distribution of the sidecar's
virtual environment, each with its version and package URL (purl), so an image scanner or an
auditor reads what the image carries from the image itself (/usr/share/doc/pcitopo/sbom.spdx.json).

What a scanner needs besides names (spdx-tools' ``pyspdxtools -i`` accepts the result):
- ``SPDXRef-DOCUMENT DESCRIBES`` the environment, which CONTAINS every package;
- checksums: a Python distribution's is the SHA-256 of its RECORD (the list of every installed
  file with its own SHA-256); a Debian package's the SHA-256 of dpkg's ``info/PKG.md5sums``
  (every installed file's MD5), when dpkg kept one;
- licences as each package declares them: a PEP 639 ``License-Expression`` as it is (SPDX by
  definition); otherwise the ``License`` field or licence classifiers, or the short names of a
  Debian machine-readable copyright file, each as a ``LicenseRef-`` carrying the declared text;
- native libraries vendored inside wheels, each its own package CONTAINED by the wheel, with a
  CPE: libxml2 and libxslt in lxml (versions as lxml reports them at run time,
  ``lxml.etree.LIBXML_VERSION``/``LIBXSLT_VERSION``: the libraries actually linked), zlib in
  grpcio (version from the shared object's ``deflate X.Y.Z Copyright`` string), BoringSSL and
  c-ares in grpcio (recognised by their strings; the wheel records no version for them, so none
  is claimed).

Standard library only: it runs under the image's own Python before the image exists.
Usage: sbom.py DPKG_STATUS SITE_PACKAGES_DIR [CREATED [NAME]]   (CREATED: ISO 8601 time, default
the epoch; the build passes its sources' commit time so that the same sources give the same
file. NAME: what the document describes, default "pcitopo image".)
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from importlib.metadata import Distribution, distributions
from pathlib import Path
from urllib.parse import quote

ROOT_ID = "SPDXRef-environment"


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


def spdx_id(key: str) -> str:
    return "SPDXRef-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def spdx_package(name: str, version: str | None, purl: str, supplier: str | None = None) -> dict:
    pkg = {"SPDXID": spdx_id(purl), "name": name, "downloadLocation": "NOASSERTION",
           "filesAnalyzed": False, "licenseConcluded": "NOASSERTION", "licenseDeclared": "NOASSERTION",
           "copyrightText": "NOASSERTION",
           "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}]}
    if version:
        pkg["versionInfo"] = version
    if supplier:
        pkg["supplier"] = f"Organization: {supplier}"
    return pkg


def _sha256(path: Path) -> list[dict]:
    try:
        return [{"algorithm": "SHA256", "checksumValue": hashlib.sha256(path.read_bytes()).hexdigest()}]
    except OSError:
        return []


class Licences:
    """The ``LicenseRef-`` entries declared text needs (``hasExtractedLicensingInfos``)."""

    def __init__(self):
        self.refs: dict[str, dict] = {}

    def ref(self, key: str, text: str, name: str) -> str:
        """One ``LicenseRef-`` per distinct text: ``GPL-2+`` and ``GPL-2`` stay apart, and
        two names that spell the same after the ID's character set get a hash each."""
        ident = "LicenseRef-" + re.sub(r"[^A-Za-z0-9.-]+", "-", key.replace("+", "-plus")).strip("-")
        if ident in self.refs and self.refs[ident]["extractedText"] != text:
            ident += "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
        self.refs.setdefault(ident, {"licenseId": ident, "extractedText": text, "name": name})
        return ident

    def python(self, dist: Distribution) -> str:
        meta = dist.metadata
        if meta.get("License-Expression"):
            return meta["License-Expression"]
        declared = (meta.get("License") or "").strip()
        classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
        text = declared or "; ".join(classifiers)
        if not text or text.upper() == "UNKNOWN":
            return "NOASSERTION"
        name = declared if declared and "\n" not in declared and len(declared) < 80 else text.splitlines()[0][:80]
        return self.ref(f"pypi-{pypi_name(meta['Name'])}", text, name)

    def debian(self, copyright_file: Path) -> str:
        """The short names of a machine-readable (DEP-5) copyright file, all of them (AND)."""
        try:
            text = copyright_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "NOASSERTION"
        if not text.startswith("Format:"):
            return "NOASSERTION"
        names = sorted({n for m in re.finditer(r"^License:[ \t]*(\S[^\n]*)$", text, re.M)
                        for n in re.split(r"\s+(?:and|or)\s+|,\s*", m.group(1).strip()) if n})
        refs = [self.ref(f"deb-{n}", f"Debian copyright short name {n!r} (DEP-5)", n) for n in names]
        return " AND ".join(refs) if refs else "NOASSERTION"


# Native libraries vendored inside wheels: (wheel, library, CPE vendor:product, how its version is read).
_LXML_PROBE = "import lxml.etree as e; print('%d.%d.%d %d.%d.%d' % (e.LIBXML_VERSION + e.LIBXSLT_VERSION))"


def _lxml_libraries(site: Path) -> list[tuple[str, str | None, str]]:
    """libxml2 and libxslt as lxml reports them, asked of lxml in ``site`` (a separate,
    isolated interpreter: nothing of that environment enters this one)."""
    probe = f"import sys; sys.path.insert(0, {str(site)!r}); {_LXML_PROBE}"
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    versions = out.stdout.split() if out.returncode == 0 else [None, None]
    return [("libxml2", versions[0], "xmlsoft:libxml2"), ("libxslt", versions[1], "xmlsoft:libxslt")]


_STRING_PROBES = (  # (library, CPE vendor:product, marker pattern, version group or None)
    ("zlib", "zlib:zlib", re.compile(rb"deflate (\d+(?:\.\d+)+) Copyright"), 1),
    ("boringssl", "google:boringssl", re.compile(rb"third_party/boringssl[-\w]*/"), None),
    ("c-ares", "c-ares_project:c-ares", re.compile(rb"c-ares resolver"), None),
)


def _bundled_in_objects(dist: Distribution) -> list[tuple[str, str | None, str]]:
    """Libraries recognised by their strings in the distribution's shared objects."""
    found: dict[str, tuple[str, str | None, str]] = {}
    for f in dist.files or []:
        if not str(f).endswith(".so") and ".so." not in str(f):
            continue
        try:
            data = Path(dist.locate_file(f)).read_bytes()
        except OSError:
            continue
        for lib, cpe, rx, group in _STRING_PROBES:
            m = rx.search(data)
            if m and lib not in found:
                found[lib] = (lib, m.group(group).decode() if group else None, cpe)
    return sorted(found.values())


def vendored(dist: Distribution, site: Path) -> list[dict]:
    """The SPDX packages for the native libraries inside ``dist``'s wheel."""
    libs = _lxml_libraries(site) if pypi_name(dist.metadata["Name"]) == "lxml" else _bundled_in_objects(dist)
    out = []
    for lib, version, cpe in libs:
        pkg = spdx_package(lib, version, f"pkg:generic/{lib}" + (f"@{quote(version)}" if version else "")
                           + f"?bundled-in={quote(pypi_name(dist.metadata['Name']))}")
        pkg["SPDXID"] = spdx_id(f"{lib} in {dist.metadata['Name']}")
        pkg["comment"] = (f"compiled into the {dist.metadata['Name']} {dist.version} wheel" +
                          ("" if version else "; the wheel records no version for it"))
        pkg["externalRefs"].append({"referenceCategory": "SECURITY", "referenceType": "cpe23Type",
                                    "referenceLocator": f"cpe:2.3:a:{cpe}:{version or '*'}:*:*:*:*:*:*:*"})
        out.append(pkg)
    return out


def _contains(parent: str, child: str) -> dict:
    return {"spdxElementId": parent, "relationshipType": "CONTAINS", "relatedSpdxElement": child}


def sbom(status: Path, site: Path, created: str, name: str = "pcitopo image") -> dict:
    licences, packages, relationships = Licences(), [], []
    doc_root = status.resolve().parents[3] / "usr/share/doc"  # /var/lib/dpkg/status -> /usr/share/doc
    for f in dpkg_packages(status):
        arch = f.get("Architecture", "all")
        pkg = spdx_package(f["Package"], f["Version"], f"pkg:deb/debian/{quote(f['Package'])}@{quote(f['Version'])}?arch={arch}", "Debian")
        pkg["checksums"] = (_sha256(status.parent / "info" / f"{f['Package']}.md5sums")
                            or _sha256(status.parent / "info" / f"{f['Package']}:{arch}.md5sums"))
        pkg["licenseDeclared"] = licences.debian(doc_root / f["Package"] / "copyright")
        packages.append(pkg)
    for dist in sorted(distributions(path=[str(site)]), key=lambda d: d.metadata["Name"].lower()):
        dname, version = dist.metadata["Name"], dist.version
        pkg = spdx_package(dname, version, f"pkg:pypi/{quote(pypi_name(dname))}@{quote(version)}")
        record = next((f for f in dist.files or [] if str(f).endswith(".dist-info/RECORD")), None)
        pkg["checksums"] = _sha256(Path(dist.locate_file(record))) if record else []
        pkg["licenseDeclared"] = licences.python(dist)
        packages.append(pkg)
        for lib in vendored(dist, site):
            packages.append(lib)
            relationships.append(_contains(pkg["SPDXID"], lib["SPDXID"]))
    for pkg in packages:
        if not pkg.get("checksums", True):
            del pkg["checksums"]
    relationships = [_contains(ROOT_ID, p["SPDXID"]) for p in packages if "bundled-in=" not in
                     p["externalRefs"][0]["referenceLocator"]] + relationships
    locators = [p["externalRefs"][0]["referenceLocator"] for p in packages]
    root = {"SPDXID": ROOT_ID, "name": name, "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION", "licenseDeclared": "NOASSERTION", "copyrightText": "NOASSERTION",
            "primaryPackagePurpose": "CONTAINER" if name.endswith("image") else "APPLICATION"}
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": name, "documentNamespace": "https://spdx.org/spdxdocs/pcitopo-image-"
        + hashlib.sha256(json.dumps(locators).encode()).hexdigest(),
        "creationInfo": {"created": created, "creators": ["Tool: pcitopo scripts/sbom.py"]},
        "documentDescribes": [ROOT_ID],
        "packages": [root, *packages],
        "relationships": [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                           "relatedSpdxElement": ROOT_ID}, *relationships],
        "hasExtractedLicensingInfos": sorted(licences.refs.values(), key=lambda r: r["licenseId"]),
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3, 4):
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    created = argv[2] if len(argv) >= 3 and argv[2] else "1970-01-01T00:00:00Z"
    name = argv[3] if len(argv) == 4 else "pcitopo image"
    json.dump(sbom(Path(argv[0]), Path(argv[1]), created, name), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
