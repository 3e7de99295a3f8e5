//go:build race

package service

// raceOn: the tests run under the race detector (builds they start run
// under it too, so that they reuse what is built).
const raceOn = true
