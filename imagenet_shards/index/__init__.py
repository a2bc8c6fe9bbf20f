"""The sample index and metadata.json: what a converted dataset records about its shards and samples.

    schema      the index's file name and columns, declared once for writer and reader
    records     SampleRecord / ShardRecord, the per-sample CRC32C, bbox text, the index writer
    columns     the one reader: the index as numpy columns (SampleColumns, ShardGroups, KeyTable)
    metadata    metadata.json: read, check, write (sealed)
    earlier     the pre-CRC32C index: refused with the command that re-creates it

The names below are the package's public face: `from imagenet_shards.index import SampleRecord`. The folder's
file names (METADATA_FILE, SPLITS, ...) are imagenet_shards.dataset_folder's.
"""

from imagenet_shards.errors import DatasetError
from imagenet_shards.index.columns import (KeyTable, SampleColumns, ShardGroups, check_columns_match, columns_from_records,
                                    parse_sample_columns, read_sample_columns, read_sample_index)
from imagenet_shards.index.metadata import (CONVERT_STATE_REMOVED, FORMAT_VERSION, METADATA_RECOGNISERS, parse_metadata,
                                     read_metadata, shard_records, write_metadata)
from imagenet_shards.index.records import (SampleRecord, ShardRecord, bbox_text, crc32c_problem, encode_sample_index,
                                    is_positional_key, iter_sample_index, parse_bbox, payload_crc32c,
                                    payload_problem, positional_key, write_sample_index)
from imagenet_shards.index.schema import (BBOX_COLUMN, COLUMNS, INDEX_CHUNK_LINES, SAMPLE_INDEX_SUFFIX, sample_index_name,
                                   split_of_index_name)

__all__ = ["BBOX_COLUMN", "COLUMNS", "CONVERT_STATE_REMOVED", "DatasetError", "FORMAT_VERSION", "INDEX_CHUNK_LINES",
           "KeyTable", "METADATA_RECOGNISERS", "SAMPLE_INDEX_SUFFIX", "SampleColumns", "SampleRecord", "ShardGroups",
           "ShardRecord", "bbox_text", "check_columns_match", "columns_from_records", "crc32c_problem",
           "encode_sample_index", "is_positional_key", "iter_sample_index", "parse_bbox", "parse_metadata",
           "parse_sample_columns",
           "payload_crc32c", "payload_problem", "positional_key", "read_metadata", "read_sample_columns",
           "read_sample_index", "sample_index_name", "shard_records", "split_of_index_name", "write_metadata",
           "write_sample_index"]
