"""WRONG ON PURPOSE (dp_overlap_buckets_in_forward_order): buckets follow the order of use, not
its reverse; since buckets go out in order, the first one (the embedding's) completes last and
every all-reduce waits for the end of backward: right numbers, nothing hidden."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "dp_overlap")
_reverse_order = make_buckets                                                 # noqa: F821


def make_buckets(params, bucket_bytes):
    buckets = _reverse_order(list(reversed(params)), bucket_bytes)   # WRONG: order of use
    return buckets
