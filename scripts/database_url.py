"""Print the database URL `make` should use: DATABASE_URL if set, else a local PostgreSQL
server on 127.0.0.1:5432 (user postgres, trust auth) if one answers, else nothing, in which
case the settings start the embedded PostgreSQL under var/.
"""

import os
import sys

LOCAL = "postgres://postgres@127.0.0.1:5432/{name}"


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "gpuplatform"
    if os.environ.get("DATABASE_URL"):
        print(os.environ["DATABASE_URL"])
        return
    try:
        import psycopg

        with psycopg.connect(
            LOCAL.format(name="postgres"), connect_timeout=2, autocommit=True
        ) as conn:
            # Django's checks look at the database itself (pytest makes its own test_ one).
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
    except Exception:  # noqa: BLE001 - any failure means "no usable local server"
        return
    print(LOCAL.format(name=name))


if __name__ == "__main__":
    main()
