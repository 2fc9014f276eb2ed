-- actionledger 0016: the write probe's table.
--
-- The serving process (server/write-probe.ts) inserts one row here every few seconds and rolls it back: a
-- database that refuses writes (out of disk, read-only, unreachable) is then seen with no traffic at all, and
-- `/readyz` says so. Nothing is ever committed to this table.
--
-- The row is wider than half a heap page (about 5 KB of padding, stored PLAIN: neither compressed nor moved to
-- TOAST), so a page holds one row at most. An aborted insert leaves its dead tuple on the page until vacuum, so
-- the next probe finds no room on the last page and extends the relation: the probe writes a new page to the
-- table's tablespace, which is what a full disk refuses (SQLSTATE 53100). A probe that only fit into an
-- existing page would succeed on a full disk. Vacuum removes the dead tuples and truncates the emptied pages
-- (the table then has none, and the next insert extends it again); the low threshold below keeps the table a few
-- pages long.

CREATE TABLE write_probe (
  padding text NOT NULL
);
ALTER TABLE write_probe ALTER COLUMN padding SET STORAGE PLAIN;
ALTER TABLE write_probe SET (
  autovacuum_vacuum_threshold = 20,
  autovacuum_vacuum_scale_factor = 0
);
