"""Every statement postjob_sa runs at runtime, named noun first.

``*_DBAPI`` statements run on a psycopg2 cursor (pyformat placeholders) on the worker's hot
path; the others are ``text()`` constructs run through a SQLAlchemy Session or Connection.
No statement is ever built from user input: values travel as bound parameters only.
"""

from __future__ import annotations

from sqlalchemy import text

# -- worker (psycopg2, autocommit) -----------------------------------------------------------

#: The worker's hot path as server-side prepared statements (parsed and planned once per
#: connection): finish the previous batch and check out the next in one round trip.
WORKER_PREPARE_DBAPI = (
    "PREPARE postjob_cycle (bigint[], bigint[], text[], jsonb[], text[], text[], jsonb[], "
    "text[], bigint[], text[], text[], text[], integer, double precision, boolean, boolean) AS "
    "SELECT id, lease_token, workflow, workflow_version, args, queue, root_id, full_id, "
    "parent_id FROM postjob.finish_and_checkout("
    "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16); "
    "PREPARE postjob_checkout (text[], text[], text[], integer, double precision, boolean, "
    "boolean) AS "
    "SELECT id, lease_token, workflow, workflow_version, args, queue, root_id, full_id, "
    "parent_id FROM postjob.checkout($1, $2, $3, $4, $5, $6, $7); "
    "PREPARE postjob_time_to_next (text[], text[], text[]) AS "
    "SELECT postjob.time_to_next_job($1, $2, $3)"
)

WORKER_CYCLE_DBAPI = (
    "EXECUTE postjob_cycle (%(ids)s::bigint[], %(leases)s::bigint[], %(outcomes)s::text[], "
    "%(results)s::jsonb[], %(errors)s::text[], %(messages)s::text[], %(backtraces)s::jsonb[], "
    "%(versions)s::text[], %(awaiting)s::bigint[], %(workflows)s::text[], "
    "%(workflow_versions)s::text[], %(queues)s::text[], %(limit)s, %(lease)s, %(fast)s, "
    "%(reap)s)"
)

#: The cycle when there is nothing to record (after a wait): checkout alone.
WORKER_CHECKOUT_DBAPI = (
    "EXECUTE postjob_checkout (%(workflows)s::text[], %(workflow_versions)s::text[], "
    "%(queues)s::text[], %(limit)s, %(lease)s, %(fast)s, %(reap)s)"
)

WORKER_TIME_TO_NEXT_DBAPI = (
    "EXECUTE postjob_time_to_next (%(workflows)s::text[], %(versions)s::text[], %(queues)s::text[])"
)

#: Before an idle wait: reap expired leases and deadlines, then ask how long to wait (two
#: statements, one round trip, each with its own snapshot).
WORKER_REAP_AND_TIME_TO_NEXT_DBAPI = (
    "SELECT postjob.reap(%(fast)s); "
    "EXECUTE postjob_time_to_next (%(workflows)s::text[], %(versions)s::text[], %(queues)s::text[])"
)

LEASE_EXTEND_DBAPI = (
    "SELECT postjob.extend_leases(%(ids)s::bigint[], %(leases)s::bigint[], %(lease)s)"
)

CLIENT_IDENTIFIER_SET_DBAPI = "SELECT postjob.set_client_identifier(%(identifier)s)"

LISTEN_DBAPI = "LISTEN postjob_notifications"

#: How a worker's connection shows in pg_stat_activity: "postjob worker host:pid".
APPLICATION_NAME_SET_DBAPI = "SELECT set_config('application_name', %(name)s, false)"

# -- workflow context (psycopg2: the worker's connection, or the session's in-txn one) -------

CHILDREN_OF_JOB_DBAPI = (
    "SELECT id, workflow, workflow_method, args, status::text, results, error, error_message "
    "FROM postjob.postjobs WHERE parent_id = %(parent_id)s"
)

CHILD_BY_KEY_DBAPI = (
    "SELECT id, workflow, status::text, results, error, error_message FROM postjob.postjobs "
    "WHERE parent_id = %(parent_id)s AND workflow = %(workflow)s "
    "AND workflow_method = 'run' AND args = %(args)s::jsonb"
)

CHILDREN_INSERT_DBAPI = (
    "INSERT INTO postjob.postjobs (parent_id, queue, workflow, args, max_attempts, timeout) "
    "SELECT %(parent_id)s, c.queue, c.workflow, c.args, c.max_attempts, c.timeout "
    "FROM unnest(%(queues)s::text[], %(workflows)s::text[], %(args)s::jsonb[], "
    "%(max_attempts)s::int[], %(timeouts)s::float8[]) "
    "AS c(queue, workflow, args, max_attempts, timeout) "
    "ON CONFLICT (parent_id, workflow, workflow_method, md5(args::text)) "
    "WHERE parent_id IS NOT NULL DO NOTHING"
)

MANUAL_TOKEN_DBAPI = "SELECT postjob.manual_token(%(job_id)s)"

WORKFLOW_STATUS_SET_DBAPI = (
    "UPDATE postjob.postjobs SET workflow_status = %(status)s, updated_at = now() "
    "WHERE id = %(job_id)s"
)

# -- the Session-bound API -------------------------------------------------------------------

JOB_ENQUEUE = text(
    "INSERT INTO postjob.postjobs (workflow, args, queue, max_attempts, timeout, "
    "workflow_version, tags, parent_id, next_run_at) "
    "VALUES (:workflow, CAST(:args AS jsonb), :queue, :max_attempts, :timeout, :version, "
    "CAST(:tags AS jsonb), :parent_id, COALESCE(:run_at, now())) "
    "RETURNING id, root_id, full_id"
)

JOB_ENQUEUE_MANY = text(
    "INSERT INTO postjob.postjobs (id, root_id, full_id, queue, workflow, workflow_version, "
    "args, tags, max_attempts, timeout, next_run_at) "
    "SELECT n.id, n.id, n.id::text, :queue, :workflow, :version, n.args, "
    "CAST(:tags AS jsonb), :max_attempts, :timeout, COALESCE(:run_at, now()) "
    "FROM (SELECT nextval('postjob.postjobs_id_seq') AS id, a.args, a.ord "
    "      FROM jsonb_array_elements(CAST(:args AS jsonb)) WITH ORDINALITY AS a(args, ord)) n "
    "ORDER BY n.ord RETURNING id"
)

JOB_EXISTS = text("SELECT status::text FROM postjob.postjobs WHERE id = :id")

JOBS_STATUS = text("SELECT id, status::text FROM postjob.postjobs WHERE id = ANY(:ids)")

JOB_CHECKOUT = text(
    "SELECT * FROM postjob.checkout(CAST(:workflows AS text[]), CAST(:versions AS text[]), "
    "CAST(:queues AS text[]), :limit, :lease, :fast)"
)

JOB_FINISH = text(
    "SELECT postjob.finish_jobs(CAST(:ids AS bigint[]), CAST(:leases AS bigint[]), "
    "CAST(:outcomes AS text[]), CAST(:results AS jsonb[]), CAST(:errors AS text[]), "
    "CAST(:messages AS text[]), CAST(:backtraces AS jsonb[]), CAST(:versions AS text[]), "
    "CAST(:awaiting AS bigint[]), :fast)"
)

TOKEN_JOB = text(
    "SELECT j.id, j.workflow, j.status::text FROM postjob.tokens t "
    "JOIN postjob.postjobs j ON j.id = t.postjob_id WHERE t.token = CAST(:token AS uuid)"
)

JOB_RESOLVE = text(
    "SELECT postjob.resolve(CAST(:token AS uuid), CAST(:result AS jsonb), :error, :message)"
)

JOBS_RESET = text("SELECT postjob.reset_jobs(CAST(:ids AS bigint[]))")

JOB_FORCE = text("SELECT postjob.force_job(:id)")

JOBS_REAP = text("SELECT postjob.reap(:fast)")
