-- actionledger 0019: what a gate call writes on every call, fewer tuples.
--
-- The rate window and the cap counters are counters: each call updates its principal's window row and up to three
-- counter rows. No index names the columns it changes (`used`, `used_count`, `used_value`), so PostgreSQL can update
-- each in place (a HOT update, no new index entry), but only while the row's page has room for the new version: at
-- the default fillfactor (100) pages are filled by inserts, and a counter on a full page writes a new version on
-- another page with an entry in each of its indexes. Leaving 30% of each new page free keeps those updates in place:
-- 20,000 counters inserted, then each updated once, gave 0 HOT updates of 20,000 at fillfactor 100 and 8,855 at 70
-- (pg_stat_user_tables.n_tup_hot_upd); in a run of gate calls on a few counters every update of both tables was
-- HOT. Pages written before this migration keep their layout until they are rewritten.
ALTER TABLE gate_rate_windows SET (fillfactor = 70);
ALTER TABLE gate_counters SET (fillfactor = 70);

-- A hold names one subject (a proposal, an approval or, later, the operation it became), but each open hold had an
-- entry in all three subject indexes, two of them for a NULL no query looks for: three index entries a counter a
-- call, written with the hold and again when it is released. Each index now holds only the holds of its kind of
-- subject. Every lookup names the subject by equality (`= $1`, which implies IS NOT NULL), so each still uses its
-- index.
DROP INDEX gate_cap_holds_operation_idx;
DROP INDEX gate_cap_holds_approval_idx;
DROP INDEX gate_cap_holds_proposal_idx;
CREATE INDEX gate_cap_holds_operation_idx ON gate_cap_holds (operation_id)
  WHERE released_at IS NULL AND operation_id IS NOT NULL;
CREATE INDEX gate_cap_holds_approval_idx ON gate_cap_holds (approval_id)
  WHERE released_at IS NULL AND approval_id IS NOT NULL;
CREATE INDEX gate_cap_holds_proposal_idx ON gate_cap_holds (proposal_id)
  WHERE released_at IS NULL AND proposal_id IS NOT NULL;
