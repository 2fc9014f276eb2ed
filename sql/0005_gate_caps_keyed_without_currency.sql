-- actionledger 0005: fixes from the gate's adversarial review.
--
-- A cap is one counter per (tenant, tool, scope, key, period), whatever currency a call names. 0004 kept one
-- counter per currency, so a caller alternating two currencies got every max_count and max_value twice. The
-- gate now refuses a value in any currency other than the tool's declared one (gate.tools.*.value), and the
-- currency column only records which one the counter is in ('-' for a count-only tool).
--
-- Existing per-currency counters of the same cap are merged into the oldest one: counts and values are added
-- (for mixed currencies the value sum over-counts, which can only refuse more until the period ends: fail
-- closed), and the holds move with them so releases still decrement the right row.

CREATE TEMPORARY TABLE gate_counter_merge ON COMMIT DROP AS
SELECT counter_id,
       min(counter_id) OVER (PARTITION BY tenant_id, tool_name, scope, scope_key, period) AS keeper_id
FROM gate_counters;

UPDATE gate_cap_holds h SET counter_id = m.keeper_id
FROM gate_counter_merge m
WHERE h.counter_id = m.counter_id AND m.counter_id <> m.keeper_id;

UPDATE gate_counters k
SET used_count = s.used_count, used_value = s.used_value
FROM (
  SELECT m.keeper_id, sum(c.used_count)::integer AS used_count, sum(c.used_value) AS used_value
  FROM gate_counter_merge m JOIN gate_counters c ON c.counter_id = m.counter_id
  GROUP BY m.keeper_id HAVING count(*) > 1
) s
WHERE k.counter_id = s.keeper_id;

DELETE FROM gate_counters c USING gate_counter_merge m
WHERE c.counter_id = m.counter_id AND m.counter_id <> m.keeper_id;

-- Drop 0004's UNIQUE (..., currency) whatever PostgreSQL named it, then key the counter without currency.
DO $$
DECLARE
  c text;
BEGIN
  FOR c IN
    SELECT con.conname FROM pg_constraint con
    WHERE con.conrelid = 'gate_counters'::regclass AND con.contype = 'u'
  LOOP
    EXECUTE format('ALTER TABLE gate_counters DROP CONSTRAINT %I', c);
  END LOOP;
END $$;

ALTER TABLE gate_counters
  ADD CONSTRAINT gate_counters_cap_key UNIQUE (tenant_id, tool_name, scope, scope_key, period);

-- Housekeeping expires abandoned proposals (releasing the caps they hold) on the fleet's schedule.
CREATE INDEX gate_proposals_open_idx ON gate_proposals (expires_at) WHERE status IN ('proposed', 'confirmed');
