package etcdembed

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore sends the embedded etcd's zap records at warn and above to a slog logger, so etcd's
// messages land in the coordinator's log in the coordinator's format.
type slogCore struct {
	log    *slog.Logger
	fields []zapcore.Field
}

func zapToSlog(log *slog.Logger) *zap.Logger { return zap.New(&slogCore{log: log}) }

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= zapcore.WarnLevel }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, fields: append(append([]zapcore.Field(nil), c.fields...), fields...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(append([]zapcore.Field(nil), c.fields...), fields...) {
		f.AddTo(enc)
	}
	args := []any{"component", "etcd"}
	for k, v := range enc.Fields {
		args = append(args, k, v)
	}
	// etcd warns about routine things (every request under load, a simple token); its warnings are
	// our debug lines and its errors our warnings. A dead etcd shows up in the coordinator's own errors.
	level := slog.LevelDebug
	if e.Level >= zapcore.ErrorLevel {
		level = slog.LevelWarn
	}
	c.log.Log(context.Background(), level, e.Message, args...)
	return nil
}

func (c *slogCore) Sync() error { return nil }
