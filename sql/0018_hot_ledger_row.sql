-- actionledger 0018: an operation's moves on the happy path (pending -> executing -> succeeded) update its row in
-- place (HOT updates), without a new entry in any index.
--
-- PostgreSQL updates a row in place, on its own page and without touching an index, only when no indexed column
-- changes, and a column in a partial index's predicate counts as indexed. Four indexes of the operations table named
-- `status` (the open operations, the executing ones by worker, the due unknown ones, the failed ones by task), so every
-- transition wrote a new version of the whole row and a new entry in each of the table's eight indexes (the
-- arguments, the identity, the effect key and the tenant listing included), and left the old entries for vacuum.
--
-- Now the operations table's indexes name only columns the happy path never changes:
--   * the operations executing under a claim, which the reconciler and the service look up by worker, are listed in
--     `operation_claims`, a narrow table written by the same trigger that checks each transition: a row when an
--     operation enters `executing`, gone when it leaves (the claim's details stay on the operation row);
--   * the states a person or the reconciler must find again (unknown, needs_review, compensating, failed) are named
--     by the column `attention`, set by that trigger (NULL in every other state), and the indexes that find them
--     are partial on `attention`;
--   * the open-operations index goes: pending work is found through the outbox, executing through operation_claims,
--     the other open states through `attention`.
-- The operations table keeps free room on each page for the versions an operation writes as it moves, and the
-- history, written three times per operation at least, keeps one index instead of two.

ALTER TABLE operations ADD COLUMN attention text
  CHECK (attention IN ('unknown', 'needs_review', 'compensating', 'failed'));

-- Written only by the triggers below, in the statement that moves the operation (no foreign key: its check would
-- lock the operation row again on every claim).
CREATE TABLE operation_claims (
  operation_id  uuid PRIMARY KEY,
  claimed_by    text
);
CREATE INDEX operation_claims_claimed_by_idx ON operation_claims (claimed_by);
ALTER TABLE operation_claims SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- Existing rows.
UPDATE operations SET attention = status WHERE status IN ('unknown', 'needs_review', 'compensating', 'failed');
INSERT INTO operation_claims (operation_id, claimed_by)
SELECT operation_id, claimed_by FROM operations WHERE status = 'executing';

ALTER TABLE operations
  ADD CONSTRAINT operations_attention_matches_status CHECK (
    attention IS NOT DISTINCT FROM (CASE WHEN status IN ('unknown', 'needs_review', 'compensating', 'failed')
                                         THEN status END));

-- The transition check (0007) also keeps `attention` and operation_claims in step with the status.
CREATE OR REPLACE FUNCTION operations_transition_check() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  IF NOT EXISTS (
    SELECT 1 FROM operation_transitions t WHERE t.from_status = OLD.status AND t.to_status = NEW.status
  ) THEN
    RAISE EXCEPTION 'operation %: % -> % is not a legal transition', OLD.operation_id, OLD.status, NEW.status
      USING ERRCODE = 'P0T01', HINT = 'actionledger:illegal_transition';
  END IF;
  IF NEW.status IN ('executing', 'succeeded', 'unknown', 'compensating', 'compensated') THEN
    NEW.provider_contact := 'maybe_called';
  ELSIF NEW.status = 'pending' THEN
    NEW.provider_contact := 'not_called';
  ELSIF NEW.provider_contact IS DISTINCT FROM OLD.provider_contact AND NOT (
    (NEW.provider_contact = 'not_called' AND OLD.status = 'executing')
    OR (NEW.provider_contact = 'no_effect_confirmed' AND OLD.status IN ('executing', 'unknown'))
    OR NEW.provider_contact = 'maybe_called'
  ) THEN
    RAISE EXCEPTION 'operation %: % -> % cannot record provider contact %', OLD.operation_id, OLD.status,
      NEW.status, NEW.provider_contact
      USING ERRCODE = 'P0T01', HINT = 'actionledger:illegal_transition';
  END IF;
  NEW.attention := CASE WHEN NEW.status IN ('unknown', 'needs_review', 'compensating', 'failed') THEN NEW.status END;
  IF NEW.status = 'executing' THEN
    INSERT INTO operation_claims (operation_id, claimed_by) VALUES (NEW.operation_id, NEW.claimed_by)
    ON CONFLICT (operation_id) DO UPDATE SET claimed_by = excluded.claimed_by;
  ELSIF OLD.status = 'executing' THEN
    DELETE FROM operation_claims WHERE operation_id = OLD.operation_id;
  END IF;
  RETURN NEW;
END $$;

-- A row written in a state other than `pending` (a restore, a hand-made row) gets the same bookkeeping; the
-- reservation, always `pending`, does not run it.
CREATE FUNCTION operations_insert_bookkeeping() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  NEW.attention := CASE WHEN NEW.status IN ('unknown', 'needs_review', 'compensating', 'failed') THEN NEW.status END;
  RETURN NEW;
END $$;

CREATE TRIGGER operations_insert_bookkeeping
  BEFORE INSERT ON operations
  FOR EACH ROW WHEN (NEW.status <> 'pending')
  EXECUTE FUNCTION operations_insert_bookkeeping();

CREATE FUNCTION operations_insert_claim() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  INSERT INTO operation_claims (operation_id, claimed_by) VALUES (NEW.operation_id, NEW.claimed_by)
  ON CONFLICT (operation_id) DO UPDATE SET claimed_by = excluded.claimed_by;
  RETURN NULL;
END $$;

CREATE TRIGGER operations_insert_claim
  AFTER INSERT ON operations
  FOR EACH ROW WHEN (NEW.status = 'executing')
  EXECUTE FUNCTION operations_insert_claim();

-- A claim handed to another worker without a status change (by hand) moves its listing too.
CREATE TRIGGER operations_claim_moved
  AFTER UPDATE OF claimed_by ON operations
  FOR EACH ROW WHEN (OLD.status = 'executing' AND NEW.status = 'executing'
    AND OLD.claimed_by IS DISTINCT FROM NEW.claimed_by)
  EXECUTE FUNCTION operations_insert_claim();

DROP INDEX operations_open_idx;
DROP INDEX operations_claimed_by_idx;
DROP INDEX operations_unknown_due_idx;
DROP INDEX operations_failed_task_idx;

-- The due `unknown` operations, in due order (NULL: due now).
CREATE INDEX operations_unknown_due_idx ON operations (next_reconcile_at NULLS FIRST) WHERE attention = 'unknown';
-- Operations a person or the compensator must find: in review or compensating, and the compensator's starting
-- points (tasks with a failed step; the task is then read whole through the identity index).
CREATE INDEX operations_attention_idx ON operations (attention, tenant_id, principal_id, task_id)
  WHERE attention IS NOT NULL;

-- Every history read is by operation (ORDER BY operation_id, id): the primary key becomes (operation_id, id), and the
-- index on id alone, one more entry for each of an operation's three or more history rows, goes. On a large history
-- the unique index takes a while to build, inside this migration's transaction, which holds the operations table
-- locked from the ADD COLUMN above: to shorten that, build it beforehand by hand with CREATE UNIQUE INDEX
-- CONCURRENTLY under this name. A concurrent build that failed leaves an invalid index under the name: it is
-- dropped and built again here.
DO $$
BEGIN
  IF EXISTS (
    SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relname = 'operation_history_operation_key' AND c.relnamespace = current_schema()::regnamespace
      AND NOT i.indisvalid
  ) THEN
    DROP INDEX operation_history_operation_key;
  END IF;
END $$;
CREATE UNIQUE INDEX IF NOT EXISTS operation_history_operation_key ON operation_history (operation_id, id);
ALTER TABLE operation_history
  DROP CONSTRAINT operation_history_pkey,
  ADD CONSTRAINT operation_history_pkey PRIMARY KEY USING INDEX operation_history_operation_key;
DROP INDEX operation_history_operation_idx;

-- Room on each page for the next versions of the operations on it (new pages only; existing ones keep their fill).
-- A claim takes the oldest waiting operations, so one claim statement moves most rows of a page at once, and each
-- moved row needs room for a whole new version on its page (the old one becomes free only once the claim commits):
-- half of each page is left for that. At 70, two of the 24 updates of test/ledger/hot-row.test.ts (12 operations
-- claimed and completed six at a time) found no room and were written as new rows, with a new entry in every index.
ALTER TABLE operations SET (fillfactor = 50);
