// The concurrency slider: moves at once, tells the load generator after 300 ms of quiet.
import { useEffect, useMemo, useState } from "react";
import { debounce } from "../debounce";

export function ConcurrencySlider(props: {
  min: number;
  max: number;
  step: number;
  applied: number | null;
  pending: number | null;
  onChange: (n: number) => void;
  waitMs?: number;
}) {
  const { min, max, step, applied, pending, onChange } = props;
  const [value, setValue] = useState<number>(applied ?? min);
  const [touched, setTouched] = useState(false);
  const send = useMemo(() => debounce(onChange, props.waitMs ?? 300), [onChange, props.waitMs]);
  useEffect(() => () => send.cancel(), [send]);
  useEffect(() => {
    if (!touched && applied !== null) setValue(applied);
  }, [applied, touched]);
  return (
    <div className="slider">
      <label htmlFor="concurrency">
        Concurrent conversations: <strong data-testid="slider-value">{value}</strong>
        <span className="muted">
          {" "}
          (running at {applied ?? "—"}
          {pending !== null && pending !== applied ? `, changing to ${pending}` : ""})
        </span>
      </label>
      <input
        id="concurrency"
        type="range"
        min={min}
        max={max}
        step={step}
        value={value}
        onChange={(e) => {
          const n = Number(e.target.value);
          setTouched(true);
          setValue(n);
          send(n);
        }}
      />
      <div className="ticks">
        <span>{min}</span>
        <span>{max}</span>
      </div>
    </div>
  );
}
