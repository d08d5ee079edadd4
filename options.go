package rdma

// Options come in three kinds, which the compiler tells apart:
//   - an EngineOption sets up an engine (a device port, its pool and
//     pollers): OpenEngine takes these;
//   - a ConnOption sets up connections (queue depths, message size,
//     security, handlers): Engine.Dial takes these, and Engine.Listen for
//     the connections it accepts;
//   - a ListenOption sets up a Listener only (its accept check);
//     Engine.Listen takes these and ConnOptions.
//
// The package-level Dial and Listen take every kind (Option): they open
// or share the engine that the engine options describe (see Engine).

// Option is any option: the package-level Dial and Listen take them all.
type Option interface {
	apply(*config) error
}

// EngineOption configures an engine: OpenEngine takes these, and the
// package-level Dial and Listen, whose engine they choose.
type EngineOption interface {
	Option
	engineOption()
}

// ListenOption configures a Listener: Engine.Listen takes these, and
// ConnOptions for the connections it accepts.
type ListenOption interface {
	Option
	listenOption()
}

// ConnOption configures a connection: Engine.Dial takes these, and
// Engine.Listen for the connections it accepts.
type ConnOption interface {
	ListenOption
	connOption()
}

// LoggerOption is WithLogger's option: given to an engine it logs the
// device's events and its connections' lifecycle, given to a connection
// or a Listener that connection's or the accepted connections'.
type LoggerOption interface {
	EngineOption
	ConnOption
}

// engineOpt, connOpt and listenOpt are the options of each kind.
type (
	engineOpt func(*config) error
	connOpt   func(*config) error
	listenOpt func(*config) error
	loggerOpt func(*config) error
)

func (o engineOpt) apply(c *config) error { return o(c) }
func (o connOpt) apply(c *config) error   { return o(c) }
func (o listenOpt) apply(c *config) error { return o(c) }
func (o loggerOpt) apply(c *config) error { return o(c) }

func (engineOpt) engineOption() {}
func (connOpt) connOption()     {}
func (connOpt) listenOption()   {}
func (listenOpt) listenOption() {}
func (loggerOpt) engineOption() {}
func (loggerOpt) connOption()   {}
func (loggerOpt) listenOption() {}

// applyOptions applies opts to c and checks the result (config.check).
func applyOptions[O Option](c *config, opts []O) error {
	for _, o := range opts {
		if Option(o) == nil {
			continue
		}
		if err := o.apply(c); err != nil {
			return err
		}
	}
	return c.check()
}
