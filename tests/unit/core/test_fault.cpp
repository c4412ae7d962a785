// The WLB4D_FAULT parser (fault.hpp): every form the tests use, and bad
// values rejected with a message naming the variable, the field and the
// accepted forms (a typo must not silently disable a fault test).
#include "wlb4d/core/fault.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <stdexcept>
#include <string>

using wlb::core::parse_fault;

TEST(FaultParser, EmptyIsNoFault) { EXPECT_TRUE(parse_fault("").kind.empty()); }

TEST(FaultParser, StallDefaultsToTheStepPhase) {
  const auto f = parse_fault("stall:rank=1:step=2");
  EXPECT_EQ(f.kind, "stall");
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.step, 2);
  EXPECT_EQ(f.phase, "step");
}

TEST(FaultParser, CrashWithPhaseAndSignal) {
  const auto f = parse_fault("crash:rank=3:step=7:phase=backward:signal=ABRT");
  EXPECT_EQ(f.kind, "crash");
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.step, 7);
  EXPECT_EQ(f.phase, "backward");
  EXPECT_EQ(f.signal, SIGABRT);
  EXPECT_EQ(parse_fault("crash:rank=0:step=0:phase=forward").signal, SIGKILL);
}

TEST(FaultParser, DelayAnyStepUnlessGiven) {
  const auto f = parse_fault("delay:rank=0:phase=ckpt_load:seconds=3");
  EXPECT_EQ(f.kind, "delay");
  EXPECT_EQ(f.phase, "ckpt_load");
  EXPECT_EQ(f.seconds, 3);
  EXPECT_EQ(f.step, -1);
  EXPECT_EQ(parse_fault("delay:rank=0:phase=backward:seconds=1:step=4").step, 4);
  // Phases outside any step take a stall without step=S.
  const auto load = parse_fault("stall:rank=1:phase=ckpt_load:signal=STOP");
  EXPECT_EQ(load.kind, "stall");
  EXPECT_EQ(load.phase, "ckpt_load");
  EXPECT_EQ(load.step, -1);
}

// A real SIGSTOP inside the checkpoint write (the phase deadline's test).
TEST(FaultParser, StallWithStopInTheSave) {
  const auto f = parse_fault("stall:rank=1:step=5:phase=ckpt_save:signal=STOP");
  EXPECT_EQ(f.kind, "stall");
  EXPECT_EQ(f.phase, "ckpt_save");
  EXPECT_EQ(f.step, 5);
  EXPECT_EQ(f.signal, SIGSTOP);
}

TEST(FaultParser, CheckpointKinds) {
  const auto w = parse_fault("ckpt_write:rank=1:after_bytes=1000000");
  EXPECT_EQ(w.after_bytes, 1000000);
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(parse_fault("ckpt_free:bytes=4096").free_bytes, 4096);
}

TEST(FaultParser, CalibrationLoad) {
  const auto f = parse_fault("calib_load:sample=3:percent=250");
  EXPECT_EQ(f.kind, "calib_load");
  EXPECT_EQ(f.sample, 3);
  EXPECT_EQ(f.percent, 250);
}

// The message names WLB4D_FAULT, the value, and what is wrong with it.
void expect_rejected(const std::string& text, const std::string& why) {
  try {
    (void)parse_fault(text);
    ADD_FAILURE() << "'" << text << "' was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("WLB4D_FAULT='" + text + "'"), std::string::npos) << m;
    EXPECT_NE(m.find(why), std::string::npos) << m;
    EXPECT_NE(m.find("stall:rank=R:step=S"), std::string::npos) << m;  // the accepted forms
  }
}

TEST(FaultParser, BadValuesAreErrorsNamingTheVariable) {
  expect_rejected("stal:rank=1:step=2", "unknown kind 'stal'");
  expect_rejected("stall:rank=1", "stall needs step=S (except at phase ckpt_load or calibrate)");
  expect_rejected("stall:step=1", "stall needs rank=R");
  expect_rejected("stall:rank=x:step=1", "rank='x' is not a non-negative integer");
  expect_rejected("stall:rank=-1:step=1", "rank='-1' is not a non-negative integer");
  expect_rejected("stall:rank=1:step=2x", "step='2x' is not a non-negative integer");
  expect_rejected("stall:rank=1:step=2:phase=optimizer", "phase='optimizer' is not step, forward, backward, calibrate, ckpt_load or ckpt_save");
  expect_rejected("stall:rank=1:step=2:signal=KILL", "signal='KILL' is not STOP");
  expect_rejected("crash:rank=1:step=2:signal=TERM", "signal='TERM' is not KILL, ABRT or SEGV");
  expect_rejected("stall:rank=1:step=2:after_bytes=5", "'after_bytes' is not a field of stall");
  expect_rejected("ckpt_write:rank=1", "ckpt_write needs after_bytes=N");
  expect_rejected("ckpt_free:bytes=", "bytes='' is not a non-negative integer");
  expect_rejected("stall:rank=1:step", "'step' is not key=value");
  expect_rejected("delay:rank=0:phase=ckpt_load", "delay needs seconds=N");
  expect_rejected("calib_load:sample=2", "calib_load needs sample=K and percent=P");
  expect_rejected("calib_load:sample=2:percent=50:rank=0", "'rank' is not a field of calib_load");
}

TEST(Fault, SpikeScalesOneStepOnEveryRankAndDelayTakesMilliseconds) {
  const auto f = wlb::core::parse_fault("spike:step=7:scale=1000");
  EXPECT_EQ(f.kind, "spike");
  EXPECT_EQ(f.step, 7);
  EXPECT_EQ(f.scale, 1000);
  EXPECT_EQ(wlb::core::parse_fault("delay:rank=1:phase=forward:ms=250").ms, 250);
  for (const char* bad : {"spike:step=7", "spike:scale=3", "spike:step=1:scale=0", "spike:rank=0:step=1:scale=2",
                          "delay:rank=0:phase=forward:ms=5:seconds=1"})
    EXPECT_THROW(wlb::core::parse_fault(bad), std::invalid_argument) << bad;
}
