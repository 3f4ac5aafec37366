"""cost: placeholder until link + cost land."""


def enrich(tmp, row, device_specs=None, device=None, dtype=None):
    return []
