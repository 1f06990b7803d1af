"""What ripieno writes: atomic files that never replace a user's, its cache, checkpoints, prediction tables.

``output_files`` (atomic writes, the cache folder, numbered names), ``generated_folders``
(folders built once under a lock in the cache), ``checkpoint_io`` (atomic checkpoints) and
``prediction_table`` (member predictions as a table users read).
"""
