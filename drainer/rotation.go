package drainer

import "context"

// followRotations reconnects when a URL file changes. The database pool
// closes its idle connections at once and the others when their statement
// is done, and opens new ones from the new file. The broker is reconnected
// between batches, once the confirms in flight are back, so nothing is
// released for it.
func (d *Drainer) followRotations(ctx context.Context) {
	go func() {
		err := d.cfg.Database.Watch(ctx, d.log, func() {
			d.log.Info("Database URL file changed; replacing the database connections", "file", d.cfg.Database.File)
			d.store.ResetConnections()
		})
		if err != nil {
			d.log.Warn("Cannot watch the database URL file; a change is seen at the next reconnect", "error", err)
		}
	}()
	err := d.cfg.Broker.Watch(ctx, d.log, func() {
		d.log.Info("Broker URL file changed; reconnecting after the batch in flight", "file", d.cfg.Broker.File)
		d.rotateBroker.Store(true)
		d.poke()
	})
	if err != nil {
		d.log.Warn("Cannot watch the broker URL file; a change is seen at the next reconnect", "error", err)
	}
}
