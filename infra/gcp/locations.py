"""Where things can live on GCP: Compute Engine regions and Cloud Storage dual-regions.

Both tables are copied by hand from Google's documentation (:data:`TABLES_AS_OF` says when);
a region or a pairing Google adds later is refused until it is added here (the error
says so).

* Regions: "Regions and zones", https://cloud.google.com/compute/docs/regions-zones
* Dual-regions: "Bucket locations", https://cloud.google.com/storage/docs/locations
  (sections "Predefined dual-regions" and "Configurable dual-regions").
"""

from __future__ import annotations

import re

#: When the tables below were read off Google's documentation.
TABLES_AS_OF = "2026-11-22"

#: Compute Engine regions (the Cloud Storage region list of the same date agrees).
REGIONS = frozenset(
    {
        "africa-south1",
        "asia-east1",
        "asia-east2",
        "asia-northeast1",
        "asia-northeast2",
        "asia-northeast3",
        "asia-south1",
        "asia-south2",
        "asia-southeast1",
        "asia-southeast2",
        "asia-southeast3",
        "australia-southeast1",
        "australia-southeast2",
        "europe-central2",
        "europe-north1",
        "europe-north2",
        "europe-southwest1",
        "europe-west1",
        "europe-west2",
        "europe-west3",
        "europe-west4",
        "europe-west6",
        "europe-west8",
        "europe-west9",
        "europe-west10",
        "europe-west12",
        "me-central1",
        "me-central2",
        "me-west1",
        "northamerica-northeast1",
        "northamerica-northeast2",
        "northamerica-south1",
        "southamerica-east1",
        "southamerica-west1",
        "us-central1",
        "us-east1",
        "us-east4",
        "us-east5",
        "us-south1",
        "us-west1",
        "us-west2",
        "us-west3",
        "us-west4",
    }
)

#: A zone is its region plus a one-letter suffix (us-central1-a).
ZONE = re.compile(r"(?P<region>[a-z]+-[a-z]+\d+)-(?P<letter>[a-z])")

#: Predefined dual-regions: location code -> its two regions. A bucket in one of them
#: names the code as its location and needs no custom placement.
PREDEFINED_DUAL_REGIONS: dict[str, frozenset[str]] = {
    "ASIA1": frozenset({"asia-northeast1", "asia-northeast2"}),
    "EUR4": frozenset({"europe-north1", "europe-west4"}),
    "EUR5": frozenset({"europe-west1", "europe-west2"}),
    "EUR7": frozenset({"europe-west2", "europe-west3"}),
    "EUR8": frozenset({"europe-west3", "europe-west6"}),
    "NAM4": frozenset({"us-central1", "us-east1"}),
}

#: Configurable dual-regions: location code -> the regions any two of which may pair.
#: The bucket's location is the code and `custom_placement_config.data_locations`
#: names the two regions. Country codes come first so that a pair both a country and
#: its continent allow (Frankfurt + Berlin) takes the country's code.
CONFIGURABLE_DUAL_REGIONS: dict[str, frozenset[str]] = {
    "AU": frozenset({"australia-southeast1", "australia-southeast2"}),
    "CA": frozenset({"northamerica-northeast1", "northamerica-northeast2"}),
    "DE": frozenset({"europe-west3", "europe-west10"}),
    "IN": frozenset({"asia-south1", "asia-south2"}),
    "IT": frozenset({"europe-west8", "europe-west12"}),
    "ASIA": frozenset({"asia-east1", "asia-southeast1"}),
    "EU": frozenset(
        {
            "europe-central2",
            "europe-north1",
            "europe-southwest1",
            "europe-west1",
            "europe-west3",
            "europe-west4",
            "europe-west8",
            "europe-west9",
            "europe-west10",
            "europe-west12",
        }
    ),
    "US": frozenset(
        {
            "us-central1",
            "us-east1",
            "us-east4",
            "us-east5",
            "us-south1",
            "us-west1",
            "us-west2",
            "us-west3",
            "us-west4",
        }
    ),
}


def zone_region(zone: str) -> str | None:
    """The region of a well-formed zone name, else None."""
    match = ZONE.fullmatch(zone)
    return match["region"] if match else None


def dual_region(primary: str, replica: str) -> tuple[str, tuple[str, ...]] | None:
    """The bucket location for a dual-region of ``primary`` and ``replica``.

    Returns ``(location, data_locations)``: for a predefined pair the code (``NAM4``)
    and no data locations; for a configurable pair the code (``US``) and both regions
    in upper case, primary first. None when Google offers no such dual-region.
    """
    pair = frozenset({primary, replica})
    if len(pair) != 2:
        return None
    for code, regions in PREDEFINED_DUAL_REGIONS.items():
        if pair == regions:
            return code, ()
    for code, regions in CONFIGURABLE_DUAL_REGIONS.items():
        if pair <= regions:
            return code, (primary.upper(), replica.upper())
    return None


def dual_region_partners(region: str) -> list[str]:
    """Every region that forms a dual-region with ``region``, sorted."""
    partners = {r for regions in PREDEFINED_DUAL_REGIONS.values() if region in regions for r in regions}
    partners |= {r for regions in CONFIGURABLE_DUAL_REGIONS.values() if region in regions for r in regions}
    partners.discard(region)
    return sorted(partners)


#: Cloud KMS location of a bucket's customer-managed key, by bucket location: a key must
#: sit where the data it encrypts sits. Predefined dual-regions have a Cloud KMS
#: location of the same name; a configurable dual-region uses its continent's
#: multi-region. Country-code dual-regions are left out until checked.
KMS_LOCATIONS = {
    "NAM4": "nam4",
    "EUR4": "eur4",
    "US": "us",
    "EU": "europe",
    "ASIA": "asia",
}
