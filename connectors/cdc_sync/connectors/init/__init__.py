"""`cdc-sync init`: a connector, a mapping and the setup SQL for a database of one's own.

`survey` reads the catalog (which tables, their keys, identities and column types) and says
what logical decoding cannot capture; `render` writes the three files from that (pure);
`command` is the command line: diff against existing files, write, apply the SQL.
"""
