// fleetcrawl's patch of FerretDB v1.24.2's SQLite pool (project/ops/install.py applies it).
//
// SQLite restarts a WAL from its beginning only when a writer finds no reader on it. FerretDB
// keeps up to 100 connections per database and a busy store always has a read going, so the
// automatic (PASSIVE) checkpoints copied every frame back but the WAL never restarted: it grew
// without end (8.4 GB beside a 1.9 GB database while 10^6 items were stored). Each file
// database gets a goroutine that, while its WAL file is over fleetcrawlWALBytes, tries a
// TRUNCATE checkpoint four times a second until one finds the WAL without readers.

package pool

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"
)

// fleetcrawlWALBytes is the WAL's size past which a reset is forced.
const fleetcrawlWALBytes = 1 << 30

// How often the WAL's size is looked at (a stat of its file), and how often a reset is tried
// while it is over fleetcrawlWALBytes: each try holds writers back for at most
// fleetcrawlWALWait. (A try that waits 50 ms every 5 s seldom finds the readers done; 100 ms
// every 250 ms keeps the WAL short, and costs writers a share of their time: so only past
// fleetcrawlWALBytes. Below it, SQLite restarts the WAL itself when a write finds no reader,
// and journal_size_limit, set by project/ops/services.py, truncates it then.)
const (
	fleetcrawlWALEvery = 250 * time.Millisecond
	fleetcrawlWALWait  = "PRAGMA busy_timeout = 100"
)

// fleetcrawlCheckpoints keeps the WAL of db, opened from uri, under fleetcrawlWALBytes until
// db is closed.
func fleetcrawlCheckpoints(db *sql.DB, name, uri string, l *slog.Logger) {
	file, err := url.PathUnescape(strings.TrimPrefix(strings.SplitN(uri, "?", 2)[0], "file:"))
	if err != nil || file == "" {
		return
	}

	for checks := 0; ; checks++ {
		time.Sleep(fleetcrawlWALEvery)

		if checks%4 == 0 {
			if err := db.Ping(); err != nil && strings.Contains(err.Error(), "database is closed") {
				return
			}
		}

		info, err := os.Stat(file + "-wal")
		if err != nil || info.Size() < fleetcrawlWALBytes {
			continue
		}

		if _, err := fleetcrawlTruncate(db); err != nil {
			if strings.Contains(err.Error(), "database is closed") {
				return
			}

			l.Warn("fleetcrawl: WAL checkpoint failed", slog.String("db", name), slog.String("error", err.Error()))
			time.Sleep(time.Second) // an error that persists: a line a second, not four
		}
	}
}

// fleetcrawlTruncate tries a TRUNCATE checkpoint once, on a connection of its own that waits
// at most fleetcrawlWALWait for the WAL's readers: with the write lock held, readers that
// begin meanwhile read the database file alone, so only those already reading are waited
// for. (With the usual 10 s busy timeout a reset waited for ever-overlapping readers while
// every writer waited for it, until writers failed with SQLITE_BUSY.) It reports whether the
// WAL was emptied.
func fleetcrawlTruncate(db *sql.DB) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()

	if _, err = conn.ExecContext(ctx, fleetcrawlWALWait); err != nil {
		return false, err
	}

	var busy, frames, copied int
	err = conn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &frames, &copied)

	// the pool's writers wait up to 10 s again: restored with a context of its own (the
	// checkpoint's may be spent), and a connection that cannot be restored is not given back
	// to the pool with a 100 ms timeout but closed (driver.ErrBadConn)
	restoreCtx, restoreCancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer restoreCancel()

	if _, restore := conn.ExecContext(restoreCtx, "PRAGMA busy_timeout = 10000"); restore != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })

		if err == nil {
			err = restore
		}
	}

	return err == nil && busy == 0, err
}
