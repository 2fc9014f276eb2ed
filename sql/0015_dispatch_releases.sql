-- actionledger 0015: never-sent claims go back to the queue, counted per operation.
--
-- A claim whose provider request never left the process (the authorization service could not decide, the
-- provider's TLS connect failed, the database failed between claim and send, the worker died before recording
-- its evidence) is released to `pending` with an exponential backoff instead of waiting for a person. This
-- column counts those releases, so that an operation that keeps failing before its send (a provider whose
-- certificate is wrong, an operation that crashes its worker every time) reaches review after the configured
-- number instead of cycling for ever. A reviewed retry starts the count again.
ALTER TABLE operations
  ADD COLUMN dispatch_releases integer NOT NULL DEFAULT 0 CHECK (dispatch_releases >= 0);
