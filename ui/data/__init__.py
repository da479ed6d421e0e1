"""The UI's reads: SQL pushed down to the store, sized to what one screen can show.

Every query here runs unchanged on ClickHouse 18.16 and current ClickHouse (chdb), under
the rules listed in ``ranksight.store.base.Store``; values reach SQL only as bound
``%(name)s`` parameters.
"""
