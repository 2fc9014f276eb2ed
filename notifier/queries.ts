/** The notifier's SQL: fixed texts with `$n` parameters; `@schema.` is bound once at start (db/db.ts). */
export const notifierQueries = {
  /** Takes up to $1 events no worker has routed yet (oldest first), marking them routed. */
  eventsClaimUnrouted: `
    UPDATE @schema.notification_events e SET fanned_out_at = now()
    WHERE e.event_id IN (
      SELECT event_id FROM @schema.notification_events WHERE fanned_out_at IS NULL
      ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED)
    RETURNING e.event_id, e.event_type, e.tenant_id, e.tool_name`,
  /** One delivery per (event, destination): $1 event ids, $2 destinations, in pairs. */
  deliveriesInsert: `
    INSERT INTO @schema.notification_deliveries (event_id, destination)
    SELECT * FROM unnest($1::uuid[], $2::text[]) ON CONFLICT DO NOTHING`,
  /**
   * Claims up to $1 due deliveries with a lease of $2 ms and a new claim token $3: pending, due, and not held
   * by a live lease (a worker that died lets its lease run out; its delivery is sent again, same event id),
   * to one of the destinations $4 this worker's configuration names (during a rolling deploy a worker on the
   * previous configuration leaves a new destination's deliveries to the workers that know it).
   */
  deliveriesClaim: `
    UPDATE @schema.notification_deliveries d
    SET claim_token = $3, claimed_until = now() + make_interval(secs => $2::double precision / 1000),
        attempts = d.attempts + 1
    FROM @schema.notification_events e
    WHERE e.event_id = d.event_id AND (d.event_id, d.destination) IN (
      SELECT event_id, destination FROM @schema.notification_deliveries
      WHERE status = 'pending' AND next_attempt_at <= now() AND (claimed_until IS NULL OR claimed_until < now())
        AND destination = ANY($4::text[])
      ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
    RETURNING d.event_id, d.destination, d.attempts, e.event_type, e.tenant_id, e.tool_name, e.subject_id,
              e.payload, e.created_at, extract(epoch FROM now())::double precision AS now_s`,
  /** Delivered, fenced on the claim. */
  deliveryDelivered: `
    UPDATE @schema.notification_deliveries
    SET status = 'delivered', ended_at = now(), claim_token = NULL, claimed_until = NULL, last_error = NULL
    WHERE event_id = $1 AND destination = $2 AND claim_token = $3 AND status = 'pending'`,
  /** Another attempt after $4 ms (the claim released), fenced on the claim. */
  deliveryRetry: `
    UPDATE @schema.notification_deliveries
    SET next_attempt_at = now() + make_interval(secs => $4::double precision / 1000), claim_token = NULL,
        claimed_until = NULL, last_error = $5
    WHERE event_id = $1 AND destination = $2 AND claim_token = $3 AND status = 'pending'`,
  /** Handed back untouched after $4 ms: the attempt is not counted, fenced on the claim. */
  deliveryRelease: `
    UPDATE @schema.notification_deliveries
    SET next_attempt_at = now() + make_interval(secs => $4::double precision / 1000), claim_token = NULL,
        claimed_until = NULL, attempts = greatest(attempts - 1, 0)
    WHERE event_id = $1 AND destination = $2 AND claim_token = $3 AND status = 'pending'`,
  /** Given up (attempts spent, or refused for good), fenced on the claim. */
  deliveryFailed: `
    UPDATE @schema.notification_deliveries
    SET status = 'failed', ended_at = now(), claim_token = NULL, claimed_until = NULL, last_error = $4
    WHERE event_id = $1 AND destination = $2 AND claim_token = $3 AND status = 'pending'`,
  /**
   * Ends as failed up to $3 deliveries still pending, to a destination none of $2 (this worker's) names, whose
   * event is older than $1 days: a destination removed from every configuration (a rolling deploy ends long
   * before that), so their events can be removed.
   */
  deliveriesAbandon: `
    UPDATE @schema.notification_deliveries d
    SET status = 'failed', ended_at = now(), claim_token = NULL, claimed_until = NULL,
        last_error = 'destination_removed'
    FROM @schema.notification_events e
    WHERE e.event_id = d.event_id AND (d.event_id, d.destination) IN (
      SELECT dd.event_id, dd.destination FROM @schema.notification_deliveries dd
      JOIN @schema.notification_events ee USING (event_id)
      WHERE dd.status = 'pending' AND NOT (dd.destination = ANY($2::text[]))
        AND ee.created_at < now() - make_interval(days => $1)
      LIMIT $3 FOR UPDATE OF dd SKIP LOCKED)
    RETURNING d.event_id, d.destination, d.attempts, e.event_type, e.tenant_id, e.tool_name, e.subject_id`,
  /** Locks up to $2 events older than $1 days none of whose deliveries is pending (oldest first). */
  eventsExpired: `
    SELECT e.event_id FROM @schema.notification_events e
    WHERE e.created_at < now() - make_interval(days => $1)
      AND NOT EXISTS (SELECT 1 FROM @schema.notification_deliveries d
                      WHERE d.event_id = e.event_id AND d.status = 'pending')
    ORDER BY e.created_at LIMIT $2 FOR UPDATE SKIP LOCKED`,
  deliveriesDeleteOf: `DELETE FROM @schema.notification_deliveries WHERE event_id = ANY($1::uuid[])`,
  eventsDelete: `DELETE FROM @schema.notification_events WHERE event_id = ANY($1::uuid[])`,
  /** Whether the approval request's own delivery to this destination is still to come. */
  requestDeliveryPending: `
    SELECT 1 FROM @schema.notification_deliveries d JOIN @schema.notification_events e USING (event_id)
    WHERE e.event_type = 'approval.requested' AND e.subject_id = $1 AND d.destination = $2 AND d.status = 'pending'`,
  /** The approval's status now: a decision event older than the latest one does not update the message. */
  approvalStatusNow: `SELECT status FROM @schema.gate_approvals WHERE approval_id = $1`,
  slackMessageInsert: `
    INSERT INTO @schema.notification_slack_messages
      (destination, channel, message_ts, approval_id, tenant_id, envelope_sha256)
    VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
  slackMessageByApproval: `
    SELECT channel, message_ts, envelope_sha256 FROM @schema.notification_slack_messages
    WHERE destination = $1 AND approval_id = $2`,
  slackMessageAt: `
    SELECT approval_id::text AS approval_id, tenant_id, envelope_sha256 FROM @schema.notification_slack_messages
    WHERE destination = $1 AND channel = $2 AND message_ts = $3`,
  slackUserLink: `
    INSERT INTO @schema.notification_slack_users (tenant_id, slack_team_id, slack_user_id, principal_id, linked_by)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (tenant_id, slack_team_id, slack_user_id)
    DO UPDATE SET principal_id = EXCLUDED.principal_id, linked_by = EXCLUDED.linked_by, linked_at = now()`,
  slackUserUnlink: `
    DELETE FROM @schema.notification_slack_users WHERE tenant_id = $1 AND slack_team_id = $2 AND slack_user_id = $3`,
  /**
   * Whether principal $1 can still authenticate in tenant $2 by any means but Slack: an API token or a client
   * certificate of that tenant neither revoked nor expired, or a console session neither ended nor expired.
   */
  principalCanAuthenticate: `
    SELECT EXISTS (SELECT 1 FROM @schema.api_tokens
                   WHERE principal_id = $1 AND tenant_id = $2 AND revoked_at IS NULL AND expires_at > now())
        OR EXISTS (SELECT 1 FROM @schema.principal_certificates
                   WHERE principal_id = $1 AND tenant_id = $2 AND revoked_at IS NULL AND not_after > now())
        OR EXISTS (SELECT 1 FROM @schema.console_sessions
                   WHERE principal_id = $1 AND ended_at IS NULL AND expires_at > now()) AS active`,
  slackUserPrincipal: `
    SELECT principal_id FROM @schema.notification_slack_users
    WHERE tenant_id = $1 AND slack_team_id = $2 AND slack_user_id = $3`,
} as const;
