// fleetcrawl's patch of FerretDB v1.24.2's SQLite pool (project/ops/install.py applies it).
//
// SQLite restarts a WAL from its beginning only when a writer finds no reader on it. FerretDB
// keeps up to 100 connections per database and a busy store always has a read going, so the
// automatic (PASSIVE) checkpoints copied every frame back but the WAL never restarted: it grew
// without end (8.4 GB beside a 1.9 GB database while 10^6 items were stored). Each file
// database gets a goroutine that, once its WAL file passes fleetcrawlWALBytes, tries a
// TRUNCATE checkpoint every 250 ms until one finds the WAL without readers.

package pool

import (
	"context"
	"database/sql"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"
)

// fleetcrawlWALBytes is the WAL's size past which it is reset.
const fleetcrawlWALBytes = 64 << 20

// fleetcrawlWALEvery is how often the WAL's size is looked at (a stat of its file), and how
// often a reset is tried while it is over fleetcrawlWALBytes.
const (
	fleetcrawlWALEvery = time.Second
	fleetcrawlWALRetry = 250 * time.Millisecond
)

// fleetcrawlWALWait is how long a reset waits for the WAL's readers (writers wait meanwhile).
const fleetcrawlWALWait = "PRAGMA busy_timeout = 100"

// fleetcrawlCheckpoints keeps the WAL of db, opened from uri, short until db is closed.
func fleetcrawlCheckpoints(db *sql.DB, name, uri string, l *slog.Logger) {
	file, err := url.PathUnescape(strings.TrimPrefix(strings.SplitN(uri, "?", 2)[0], "file:"))
	if err != nil || file == "" {
		return
	}

	for {
		info, err := os.Stat(file + "-wal")
		if err != nil || info.Size() < fleetcrawlWALBytes {
			time.Sleep(fleetcrawlWALEvery)

			if err := db.Ping(); err != nil && strings.Contains(err.Error(), "database is closed") {
				return
			}

			continue
		}

		done, err := fleetcrawlTruncate(db)

		switch {
		case err != nil && strings.Contains(err.Error(), "database is closed"):
			return
		case err != nil:
			l.Warn("fleetcrawl: WAL checkpoint failed", slog.String("db", name), slog.String("error", err.Error()))
			time.Sleep(fleetcrawlWALEvery)
		case !done:
			time.Sleep(fleetcrawlWALRetry)
		}
	}
}

// fleetcrawlTruncate tries a TRUNCATE checkpoint once, on a connection of its own that waits
// at most fleetcrawlWALWait for the WAL's readers: with the write lock held, readers that
// begin meanwhile read the database file alone, so only those already reading are waited
// for. (With the usual 10 s busy timeout a reset waited for ever-overlapping readers while
// every writer waited for it, until writers failed with SQLITE_BUSY.) It reports whether
// the WAL was emptied.
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

	if _, restore := conn.ExecContext(ctx, "PRAGMA busy_timeout = 10000"); restore != nil && err == nil {
		err = restore
	}

	return err == nil && busy == 0, err
}
