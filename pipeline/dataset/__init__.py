"""dataset: many traces as one hive-partitioned Parquet dataset (`batch`), queried with SQL (`query`)."""
