-- actionledger 0007: the database refuses an illegal state transition, and records whether the provider may
-- have been called for an operation as a typed fact.

-- The legal transitions (the same table as ledger/transitions.ts LEGAL_TRANSITIONS; a test keeps them equal).
-- from_status NULL is the reservation. history_reason_prefix: the move is legal only with a history reason
-- starting with it (a dispatcher's release of a claim it never sent); the trigger below cannot see the reason,
-- `actionledger verify` checks it.
CREATE TABLE operation_transitions (
  from_status            text,
  to_status              text NOT NULL,
  history_reason_prefix  text
);
CREATE UNIQUE INDEX operation_transitions_pair_idx ON operation_transitions (coalesce(from_status, ''), to_status);

INSERT INTO operation_transitions (from_status, to_status, history_reason_prefix) VALUES
  (NULL, 'pending', NULL),
  ('pending', 'pending', NULL),
  ('pending', 'executing', NULL),
  ('executing', 'succeeded', NULL),
  ('executing', 'unknown', NULL),
  ('executing', 'needs_review', NULL),
  ('executing', 'failed', NULL),
  ('executing', 'pending', 'released:'),
  ('unknown', 'succeeded', NULL),
  ('unknown', 'needs_review', NULL),
  ('needs_review', 'pending', NULL),
  ('needs_review', 'succeeded', NULL),
  ('needs_review', 'failed', NULL),
  ('needs_review', 'compensating', NULL),
  ('succeeded', 'compensating', NULL),
  ('compensating', 'compensated', NULL),
  ('compensating', 'needs_review', NULL);

-- Whether a request of the operation's current attempt may have reached the provider:
--   not_called           nothing of this attempt has left (reservation, release, reviewed retry, a refusal
--                        before the send by the worker holding the claim, a connection that failed before any
--                        byte was written);
--   maybe_called         a request may have left (set by the claim, before any send);
--   no_effect_confirmed  the provider's readback by effect key says it holds no effect.
-- A reviewed retry is allowed only for not_called and no_effect_confirmed.
ALTER TABLE operations
  ADD COLUMN provider_contact text NOT NULL DEFAULT 'maybe_called'
    CHECK (provider_contact IN ('not_called', 'maybe_called', 'no_effect_confirmed'));

-- Existing rows: "may have been called" unless the code that wrote them was sure. A pending row's current
-- attempt was never sent; an operation in review for a reason the previous code wrote only before any send
-- (a pre-dispatch refusal, a connection that failed before any byte) or after a readback that found no effect
-- keeps the retry it was allowed. Every other row, executing ones included, may have been called.
UPDATE operations SET provider_contact = 'not_called' WHERE status = 'pending';
UPDATE operations SET provider_contact = 'not_called'
WHERE status = 'needs_review'
  AND (review_reason ~ '^(route|arguments|credential|authorization|evidence|final_check|internal):'
    OR review_reason LIKE 'provider:provider\_unreachable:%');
UPDATE operations SET provider_contact = 'no_effect_confirmed'
WHERE status = 'needs_review' AND review_reason = 'no_effect_confirmed';

-- A new reservation has called nothing.
ALTER TABLE operations ALTER COLUMN provider_contact SET DEFAULT 'not_called';

-- Refuses a status change that is not in operation_transitions, and keeps provider_contact conservative: a
-- move into a state where a request may have left (or an effect exists) says maybe_called whatever the
-- statement set; a move to pending starts an attempt nothing of which was sent; not_called is accepted only
-- from the worker holding the claim (from executing), no_effect_confirmed only from a readback (from
-- executing or unknown).
CREATE FUNCTION operations_transition_check() RETURNS trigger
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
  RETURN NEW;
END $$;

CREATE TRIGGER operations_transition_check
  BEFORE UPDATE ON operations
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION operations_transition_check();

-- Without a status change the fact may only become more conservative.
CREATE FUNCTION operations_contact_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'operation %: provider contact % cannot become % in %', OLD.operation_id, OLD.provider_contact,
    NEW.provider_contact, OLD.status
    USING ERRCODE = 'P0T01', HINT = 'actionledger:illegal_transition';
END $$;

CREATE TRIGGER operations_contact_check
  BEFORE UPDATE ON operations
  FOR EACH ROW WHEN (OLD.status IS NOT DISTINCT FROM NEW.status
    AND OLD.provider_contact IS DISTINCT FROM NEW.provider_contact AND NEW.provider_contact <> 'maybe_called')
  EXECUTE FUNCTION operations_contact_check();
