-- actionledger 0006: a worker's heartbeat lists the claims it still holds.
-- A live, heartbeating worker can lose track of a claim (a write it could not make and gave up on); the
-- reconciler then also takes an `executing` row whose live worker no longer lists its claim, once the listing
-- is newer than the claim by the orphan threshold (so a claim made just before a heartbeat is never taken).
-- NULL (a worker from before this migration) lists nothing and is judged by its heartbeat alone.
ALTER TABLE workers
  ADD COLUMN claim_tokens uuid[],
  ADD COLUMN claims_listed_at timestamptz,
  ADD CONSTRAINT workers_claims_listed_together CHECK ((claim_tokens IS NULL) = (claims_listed_at IS NULL));
