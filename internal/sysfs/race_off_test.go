//go:build !race

package sysfs

const raceOn = false
