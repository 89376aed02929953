// One KPI card: a label and a figure ("—" without data), red when flagged, with the
// baseline arm's figure beneath when there is one.
export function Kpi(props: { label: string; value: string; alert?: boolean; hint?: string; vs?: string | null }) {
  return (
    <div className={`kpi${props.alert ? " kpi-alert" : ""}`} title={props.hint} data-testid={`kpi-${props.label}`}>
      <div className="kpi-value">{props.value}</div>
      <div className="kpi-label">{props.label}</div>
      {props.vs && (
        <span className="vs" data-testid={`kpi-vs-${props.label}`}>
          {props.vs}
        </span>
      )}
    </div>
  );
}
