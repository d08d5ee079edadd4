package main

// cycles reads the time-stamp counter, as perftest's get_cycles does.
// In a VM whose clocksource is the HPET (qemu TCG), time.Now traps into
// the emulated device and costs microseconds; RDTSC does not.
func cycles() uint64
